"""Best of n: fork n branches from one turn and sample a continuation on each.

The branches share the conversation so far and the new message, so the gateway computes that
prefix once: the first branch computes the message's tokens, the others find them in the radix
cache and compute only their last partial page.

    make run                                 # the gateway, in another terminal
    .venv/bin/python examples/best_of_n.py   # [--n 3] [--base-url URL] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import os

import sdk

OPENING = "Write the opening sentence of a story about a lighthouse keeper."
CONTINUE = ("Continue the story with one more sentence, in which something unexpected happens "
            "to the lighthouse keeper during a stormy night.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=os.environ.get("RADIXGATE_API_KEY"))
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()

    with sdk.Client(args.base_url, args.api_key) as client:
        loop = sdk.AgentLoop.create(client, system="You are a concise storyteller.",
                                    generate={"max_tokens": 24})
        opening = loop.run(OPENING)
        print(f"opening: {opening.text.strip()}\n")
        branches = loop.best_of(args.n, CONTINUE, temperature=0.9, seed=1)
    for record in branches:
        print(f"[{record.branch}] {(record.turn.content or '').strip()}")
    print()
    print(sdk.turn_table([*opening.turns, *branches]))
    first, rest = branches[0], branches[1:]
    if rest:
        print(f"\nthe first branch computed {first.computed_tokens} tokens; the other "
              f"{len(rest)} computed {', '.join(str(r.computed_tokens) for r in rest)} "
              "(the shared prefix came from the cache)")


if __name__ == "__main__":
    main()
