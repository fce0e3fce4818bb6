from __future__ import annotations

import pytest

from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from tests.tiny_model import tiny_model


@pytest.fixture(scope="session")
def real_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(embedded_gguf_path())


@pytest.fixture(scope="session")
def tiny(real_tokenizer: Tokenizer) -> LoadedModel:
    return tiny_model(real_tokenizer, scale=0.5)
