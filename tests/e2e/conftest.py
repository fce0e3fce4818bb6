"""Real-model fixtures: the embedded SmolLM2-135M GGUF, loaded once per test session."""

from __future__ import annotations

import pytest
import torch

from engine.models.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def loaded_model() -> LoadedModel:
    torch.set_num_threads(2)
    return load_model(None, "fp32", show_progress=False)
