"""Rank 0's side of tensor parallelism: it checks the split, starts the followers (one process
each, `python -m engine.tp.follower`), sends them their shards and owns their lives.

Supervision: the followers are children of this process and never outlive it. `close()` (and,
if nobody calls it, a finalizer at garbage collection or interpreter exit) stops them: a `Stop`
message, then SIGTERM, then SIGKILL. A follower whose parent dies (SIGKILL included) exits
within a second (engine.tp.follower watches its parent), and one whose connection to rank 0
breaks exits at once. A follower that dies makes rank 0's next collective fail: the group is
then closed and every later step raises `EngineShutdown`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch._C import _distributed_c10d as c10d

from engine.attention.base import PagedAttentionBackend
from engine.engine_config import EngineConfig
from engine.errors import EngineError, EngineShutdown, InvalidParallelism
from engine.kv_pool import KVPool
from engine.model_runner import ModelRunner
from engine.models.loader import LoadedModel
from engine.tp.group import START_TIMEOUT_S, TPGroup, open_store
from engine.tp.runner import RankSetup, Stop, TensorParallelRunner
from engine.tp.shard import build_model, check_split, shard_model

logger = logging.getLogger(__name__)

STEP_TIMEOUT_S = 600.0  # rank 0's longest wait on the others inside one step
STOP_GRACE_S = 5.0


def rank_device(device: str, rank: int) -> torch.device:
    """Rank `rank`'s device: the CPU for every rank, or the rank-th GPU from `device`'s index."""
    base = torch.device(device)
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def check_options(config: EngineConfig) -> None:
    """Raises `InvalidParallelism` for options that do not compose with `--tp` yet."""
    if config.host_kv_memory_bytes or config.kv_disk_bytes:
        raise InvalidParallelism("--tp does not run with the host or disk KV tier yet "
                                 "(--host-kv-memory, --kv-disk): they copy whole pages of "
                                 "one rank's pool")
    try:
        base = torch.device(config.device)
    except RuntimeError as exc:
        raise InvalidParallelism(f"device '{config.device}' is not a torch device: {exc}"
                                 ) from exc
    if base.type not in ("cpu", "cuda"):
        raise InvalidParallelism(f"--tp runs on cpu or cuda, not '{config.device}'")
    if base.type == "cuda" and torch.cuda.device_count() < (base.index or 0) + config.tp:
        raise InvalidParallelism(f"--tp {config.tp} on {config.device} needs "
                                 f"{(base.index or 0) + config.tp} GPUs; "
                                 f"{torch.cuda.device_count()} are visible")


class TensorParallel:
    """A running group of `config.tp` ranks: this process (rank 0) and its followers.
    `loaded` is rank 0's shard of the model, on the CPU. Raises `InvalidParallelism` (before
    starting anything) for a split the model or the options do not allow, `EngineError` when a
    follower fails to start."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        tp = config.tp
        check_split(loaded.model.config, tp)
        check_options(config)
        self.world_size = tp
        self.device = rank_device(config.device, 0)
        self.is_broken = False  # closed, or failed: no step runs again
        self.has_failed = False  # a step failed on some rank (the worker should restart)
        # The ranks share the machine's cores: each gets its share of this process's threads.
        num_threads = max(1, torch.get_num_threads() // tp)
        torch.set_num_threads(num_threads)
        store = open_store(0, 0, tp, START_TIMEOUT_S)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._finalizer = weakref.finalize(self, _stop_processes, self._procs)
        for rank in range(1, tp):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", "engine.tp.follower", "--port", str(store.port),
                 "--rank", str(rank), "--world-size", str(tp),
                 "--device", str(rank_device(config.device, rank)),
                 "--threads", str(num_threads), "--parent-pid", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        try:
            self._wait_started(store)
            self.group = TPGroup(store, 0, tp, self.device, STEP_TIMEOUT_S)
            model = loaded.model
            for rank in range(1, tp):
                self.group.send_object(shard_model(model, tp, rank), rank)
            own = build_model(shard_model(model, tp, 0), self.group.all_reduce)
        except BaseException:
            self.close()
            raise
        self.loaded = replace(loaded, model=own)
        self._store = store  # the followers' rendezvous; kept while they run

    def runner(self, pool: KVPool, backend: type[PagedAttentionBackend]) -> ModelRunner:
        """Have every follower build its pool (`pool`'s layout over its KV heads) and runner,
        and return rank 0's runner. Raises `EngineError` when a follower fails to."""
        with self.collective():
            self.group.broadcast_object(RankSetup(pool.layout, pool.k[0].dtype, backend))
            self.group.all_reduce(torch.ones(1, device=self.group.comm_device))  # all ready
        return TensorParallelRunner(self.loaded.model, pool, backend, self)

    @contextmanager
    def collective(self) -> Iterator[None]:
        """Around rank 0's part of anything every rank runs: a failure leaves the ranks out of
        step, so it closes the group (and is re-raised); a closed group raises at once."""
        if self.is_broken:
            raise EngineShutdown("the tensor-parallel ranks have stopped; restart the engine")
        try:
            yield
        except BaseException as exc:
            logger.error("tensor-parallel step failed, stopping the ranks: %s", exc)
            self.has_failed = True
            self.close(graceful=False)
            if isinstance(exc, RuntimeError):  # gloo/NCCL: a rank died or hung up
                raise EngineShutdown(f"a tensor-parallel rank failed: {exc}") from exc
            raise

    def close(self, graceful: bool = True) -> None:
        """Stop every follower (idempotent): with `graceful` (and a sound group) a `Stop`
        message first, then SIGTERM and SIGKILL to whoever is left."""
        if graceful and not self.is_broken and hasattr(self, "group"):
            try:
                self.group.broadcast_object(Stop())
                for proc in self._procs:
                    proc.wait(timeout=STOP_GRACE_S)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass  # a follower is gone or stuck: the finalizer ends the rest
        self.is_broken = True
        self._finalizer()

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def _wait_started(self, store: c10d.Store) -> None:
        """Until every follower is ready to join, failing fast on one that exits."""
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = set(range(1, self.world_size))
        while pending:
            for rank in list(pending):
                if store.check([f"started/{rank}"]):
                    pending.discard(rank)
                elif (code := self._procs[rank - 1].poll()) is not None:
                    raise EngineError(f"tensor-parallel rank {rank} exited with code {code} "
                                      "while starting (its error is on stderr above)")
            if pending and time.monotonic() > deadline:
                raise EngineError(f"tensor-parallel ranks {sorted(pending)} did not start in "
                                  f"{START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)


def _stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every live follower, then SIGKILL those alive after a grace period."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
