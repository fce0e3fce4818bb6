"""The SDK imports without torch and never imports the server packages."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "sdk"
SERVER_PACKAGES = {"torch", "engine", "gateway", "sessions", "observability"}


def test_import_sdk_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import sdk\n"
            "assert sdk.Client and sdk.AsyncClient and sdk.NotFoundError\n"
            "bad = sorted(m for m, mod in sys.modules.items()\n"
            f"            if mod is not None and m.split('.')[0] in {sorted(SERVER_PACKAGES)!r})\n"
            "assert not bad, bad\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=SDK.parent, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_sdk_sources_import_no_server_package() -> None:
    for path in SDK.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in SERVER_PACKAGES, f"{path.name} imports {name}"


def test_all_is_the_public_api() -> None:
    import sdk

    assert sorted(set(sdk.__all__)) == sorted(sdk.__all__)
    for name in sdk.__all__:
        assert getattr(sdk, name) is not None
