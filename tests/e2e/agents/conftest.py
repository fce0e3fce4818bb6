"""One live `radixgate serve` for the agent tests (each test tells its own sessions apart by
the session ids that appeared while it ran)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.agents.claude_code_install import (
    ClaudeCode,
    RegistryUnreachable,
    install_claude_code,
)
from tests.e2e.agents.live_serve import LiveServer


@pytest.fixture(scope="package")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # These tests check the protocol with the 135M model, whose greedy replies decide whether a
    # client's run ends in its turn or output limits. They pin fp32 (the codes' exact weights,
    # the default these replies were first checked with); the int8 default's activation
    # rounding changes them (Claude Code's "Read calc.py." then runs past its 256-token cap).
    # The int8 path is served in tests/e2e/test_serve.py and the real-model tier.
    with LiveServer(tmp_path_factory.mktemp("serve-state"), "--threads", "1",
                    "--dtype", "fp32") as server:
        yield server


@pytest.fixture(scope="package")
def claude_code() -> ClaudeCode:
    try:
        return install_claude_code()
    except RegistryUnreachable as exc:
        pytest.skip(f"Claude Code cannot be installed: {exc}")
