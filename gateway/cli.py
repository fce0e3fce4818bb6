"""The `radixgate` console script: one entry point, subcommands owned by their packages."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    # Imported here so `radixgate --help` stays fast and the SDK-only install can still run it.
    from engine.cli import add_subcommands
    from engine.spec.train_draft_cli import add_train_draft_subcommand
    from gateway.commands import add_subcommands as add_gateway_subcommands

    parser = argparse.ArgumentParser(prog="radixgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    add_gateway_subcommands(sub)
    add_train_draft_subcommand(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
