"""`--tp` on the command line: `generate`/`engine` take it, `serve` passes it to its workers,
and a --tp the model cannot split stops the command with a message, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli import engine_config_from_args
from gateway.cli import build_parser, main
from gateway.commands import _engine_args


def test_generate_with_a_tp_that_does_not_divide_the_heads(tiny_llama: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    code = main(["generate", "hi", "--model", str(tiny_llama), "--dtype", "fp32", "--tp", "3",
                 "--max-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert ("radixgate: error: --tp 3 does not divide this model (llama): it has 4 attention "
            "heads, 2 KV heads") in err
    assert "Traceback" not in err


def test_tp_reaches_the_engine_config_and_serve_workers() -> None:
    parser = build_parser()
    assert engine_config_from_args(parser.parse_args(["engine", "--tp", "2"])).tp == 2
    assert engine_config_from_args(parser.parse_args(["engine"])).tp == 1
    argv = _engine_args(parser.parse_args(["serve", "--tp", "2"]))
    assert argv[argv.index("--tp") + 1] == "2"
    assert "--tp" not in _engine_args(parser.parse_args(["serve"]))
