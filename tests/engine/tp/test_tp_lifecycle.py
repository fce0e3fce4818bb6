"""Every process `--tp` starts is supervised: followers stop with rank 0 (closed, or killed),
and a follower's death fails rank 0's steps with a typed error instead of hanging them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.engine import Engine, EngineConfig
from engine.errors import EngineShutdown
from engine.models.loader import load_model
from engine.protocol import Extend
from engine.sampling_params import SamplingParams
from tests.engine.tp.tp_runs import PROMPTS, is_running

REPO = Path(__file__).resolve().parents[3]

# Rank 0 in a process of its own: prints its followers' pids, then idles until killed.
RANK0 = """
import sys, time
from engine.engine import Engine, EngineConfig
from engine.models.loader import load_model
engine = Engine(load_model(sys.argv[1], "fp32", show_progress=False),
                EngineConfig(tp=2, kv_memory_bytes=4 << 20))
print(*engine.tp.pids, flush=True)
time.sleep(600)
"""


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [pid for pid in pids if is_running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def test_followers_exit_when_rank0_is_killed(tiny_llama: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rank0 = subprocess.Popen([sys.executable, "-c", RANK0, str(tiny_llama)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert rank0.stdout is not None
        pids = [int(pid) for pid in rank0.stdout.readline().split()]
        assert len(pids) == 1 and all(is_running(pid) for pid in pids)
        rank0.send_signal(signal.SIGKILL)
        rank0.wait()
        assert _wait_gone(pids, timeout_s=10.0) == []
    finally:
        rank0.kill()
        rank0.wait()


def test_a_dead_follower_fails_steps_with_engine_shutdown(tiny_llama: Path) -> None:
    engine = Engine(load_model(str(tiny_llama), "fp32", show_progress=False),
                    EngineConfig(tp=2, kv_memory_bytes=4 << 20))
    assert engine.tp is not None
    (pid,) = engine.tp.pids
    try:
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone([pid], timeout_s=5.0) == []
        for i in range(2):  # the step that finds it gone, and every later one
            engine.submit(Extend(f"r{i}", "t", None, list(PROMPTS[0]),
                                 SamplingParams(max_tokens=4, ignore_eos=True)))
            with pytest.raises(EngineShutdown, match="tensor-parallel"):
                engine.run_until_idle()
            engine.fail_all("engine_shutdown", "test")
        assert engine.tp.has_failed  # `radixgate engine` exits on it, to be restarted
    finally:
        engine.close()
