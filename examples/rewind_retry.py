"""Rewind and retry: redo a turn with new sampling, or rewind and ask something else.

`retry_from(turn)` moves the branch back and sends that turn's input again (here with a
temperature and seed, for a different answer); `retry_from(turn, message)` rewinds to `turn` and
continues with a new message. The history before the rewind point stays cached.

    make run                                   # the gateway, in another terminal
    .venv/bin/python examples/rewind_retry.py  # [--base-url URL] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import os

import sdk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=os.environ.get("RADIXGATE_API_KEY"))
    args = parser.parse_args()

    with sdk.Client(args.base_url, args.api_key) as client:
        loop = sdk.AgentLoop.create(client, system="Answer in one short sentence.",
                                    generate={"max_tokens": 24})
        fruit = loop.run("Name a fruit that is red.")
        taste = loop.run("Describe how it tastes.")
        print(f"1. {fruit.text.strip()}\n2. {taste.text.strip()}")

        retried = loop.retry_from(taste.final_turn.id, temperature=0.9, seed=1)
        print(f"2 again (same question, resampled): {retried.text.strip()}")

        other = loop.retry_from(fruit.final_turn.id, "Name a vegetable that is green instead.")
        print(f"rewound to 1, asked something else: {other.text.strip()}\n")
        state = loop.session.refresh()
    print(sdk.turn_table([*fruit.turns, *taste.turns, *retried.turns, *other.turns]))
    print(f"\nthe tree holds {len(state.turns)} turns; main is at {state.branches['main']}")


if __name__ == "__main__":
    main()
