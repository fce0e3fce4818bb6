"""Greedy runs at a given --tp, and whether a process still runs: what the tensor-parallel
tests compare and check."""

from __future__ import annotations

import os
from pathlib import Path

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

# A first prompt, one that shares its first two pages (page_size 4), and one of a single token.
PROMPTS = ([1, 5, 9, 300, 20, 44, 80, 7, 1000, 3], [1, 5, 9, 300, 20, 44, 80, 7, 77, 88],
           [42])


def is_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not reaped, is not)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def follower_pids() -> list[int]:
    """This process's live tensor-parallel followers."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"engine.tp.follower" in cmdline and is_running(
                int(entry.name)):
            pids.append(int(entry.name))
    return pids


def greedy(loaded: LoadedModel, tp: int, max_tokens: int = 12,
           kv_memory_bytes: int = 2 << 20) -> list[list[int]]:
    """Greedy tokens of `PROMPTS` at `tp` ranks: the first alone, then the other two in one
    batch (the second's first pages from the prefix cache); prefills chunked at 16 tokens.
    Checks that `close()` leaves no follower running."""
    engine = Engine(loaded, EngineConfig(tp=tp, page_size=4, max_batch_tokens=16,
                                         kv_memory_bytes=kv_memory_bytes,
                                         check_invariants=True))
    try:
        outputs: dict[str, list[int]] = {}
        for group in ([0], [1, 2]):
            for i in group:
                engine.submit(Extend(f"r{i}", "t", None, list(PROMPTS[i]), SamplingParams(
                    max_tokens=max_tokens, ignore_eos=True)))
            outputs.update({m.request_id: m.output_token_ids for m in engine.run_until_idle()
                            if isinstance(m, Finished)})
        engine.check_invariants()
    finally:
        pids = engine.tp.pids if engine.tp is not None else []
        engine.close()
    assert not [pid for pid in pids if is_running(pid)], "followers outlived close()"
    return [outputs[f"r{i}"] for i in range(len(PROMPTS))]
