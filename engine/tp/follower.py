"""`python -m engine.tp.follower`: one tensor-parallel follower rank, started by rank 0
(engine.tp.launch), never by hand.

It joins the group, receives its shard and rank 0's pool layout, then runs every step rank 0
broadcasts (`StepInputs`: a forward over its shard and KV heads; `CopyRows`; `Stop`) until told
to stop. It exits when its parent is gone (a watchdog thread polls the parent pid: reparenting
is the one sign that survives SIGKILL) or when the group's connection breaks.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch

from engine.errors import EngineError
from engine.kv_pool import KVPool
from engine.model_runner import ModelRunner, StepInputs
from engine.tp.group import START_TIMEOUT_S, TPGroup, open_store
from engine.tp.runner import CopyRows, RankSetup, Stop, step_on
from engine.tp.shard import ModelShard, build_model

# A follower waits for the next step as long as the engine idles; it stops when rank 0 goes,
# through the watchdog or a broken connection, not through this.
IDLE_TIMEOUT_S = 30 * 24 * 3600.0
PARENT_POLL_S = 0.5


def watch_parent(parent_pid: int) -> None:
    """Exit this process (at once, no cleanup) within `PARENT_POLL_S` of `parent_pid` ceasing
    to be its parent."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(3)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def serve(group: TPGroup, runner: ModelRunner) -> None:
    """Run rank 0's broadcasts until `Stop`."""
    device = group.device
    while True:
        message = group.broadcast_object()
        if isinstance(message, StepInputs):
            runner.forward_step(step_on(message, device))
        elif isinstance(message, CopyRows):
            runner.copy_rows(message.src_slots, message.dst_slots)
        elif isinstance(message, Stop):
            return
        else:
            raise EngineError(f"unexpected message {type(message).__name__} from rank 0")


def run(port: int, rank: int, world_size: int, device: torch.device) -> None:
    store = open_store(port, rank, world_size, START_TIMEOUT_S)
    store.set(f"started/{rank}", "1")
    group = TPGroup(store, rank, world_size, device, IDLE_TIMEOUT_S)
    shard = group.recv_object(0)
    assert isinstance(shard, ModelShard)
    model = build_model(shard, group.all_reduce)
    if device.type != "cpu":
        model = model.to(device)
    setup = group.broadcast_object()
    assert isinstance(setup, RankSetup)
    pool = KVPool(model.config, setup.layout, setup.kv_dtype, device=device)
    runner = ModelRunner(model, pool, setup.backend)
    group.all_reduce(torch.ones(1, device=group.comm_device))  # ready
    serve(group, runner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tp.follower")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    watch_parent(args.parent_pid)
    if os.getppid() != args.parent_pid:
        return 3  # rank 0 died before the watchdog started
    torch.set_num_threads(args.threads)
    try:
        run(args.port, args.rank, args.world_size, torch.device(args.device))
    except (RuntimeError, EngineError) as exc:
        # gloo/NCCL raise RuntimeError when rank 0 hangs up (it exited or was killed).
        print(f"radixgate tp rank {args.rank}: stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    sys.stderr.flush()
    # Told to stop: nothing to save, and skipping torch's interpreter teardown (~0.4 s) lets
    # rank 0's close() return sooner.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
