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
    with LiveServer(tmp_path_factory.mktemp("serve-state")) as server:
        yield server


@pytest.fixture(scope="package")
def claude_code() -> ClaudeCode:
    try:
        return install_claude_code()
    except RegistryUnreachable as exc:
        pytest.skip(f"Claude Code cannot be installed: {exc}")
