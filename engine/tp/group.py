"""A tensor-parallel group's communication: one process group over the ranks, gloo for CPU
ranks and NCCL for CUDA ones, built directly on a TCPStore (as engine.disagg builds its pairs),
so torch.distributed's default group stays free for anyone else.

Three kinds of traffic: the all-reduce of the o and down projections' partial outputs (the
model's `reduce`), rank 0's broadcast of each step's inputs (pickled; the group listens on
127.0.0.1 only, and only processes rank 0 started join it), and at start the shards rank 0
sends each follower. Objects travel as a length, then their pickle as uint8 (on the GPU for
NCCL, which moves only device tensors).
"""

from __future__ import annotations

import datetime
import pickle
import socket
from typing import Any

import torch
from torch._C import _distributed_c10d as c10d  # torch.distributed re-exports these untyped

from engine.errors import InvalidParallelism

HOST = "127.0.0.1"  # every rank runs on this host
START_TIMEOUT_S = 300.0  # a follower imports torch and the engine before it joins


def open_store(port: int, rank: int, world_size: int, timeout_s: float) -> c10d.TCPStore:
    """Rank 0 serves the store on a free port of 127.0.0.1 (read back from `.port`; `port` is
    ignored); the others connect to `port`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank != 0:
        return c10d.TCPStore(HOST, port, world_size, False, timeout)
    # TCPStore would listen on every interface; a socket of our own keeps it on loopback.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    listener.listen(world_size)
    return c10d.TCPStore(HOST, listener.getsockname()[1], world_size, True, timeout,
                         wait_for_workers=False, master_listen_fd=listener.detach())


class TPGroup:
    """The ranks' process group. `timeout_s` bounds every wait on the others: rank 0 waits only
    inside a step, so a short one; followers wait for the next step as long as the engine idles,
    so theirs is long, and they rely on the connection failing when rank 0 is gone."""

    def __init__(self, store: c10d.Store, rank: int, world_size: int, device: torch.device,
                 timeout_s: float) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        # NCCL moves only device tensors; gloo's are CPU tensors.
        self.comm_device = device if device.type == "cuda" else torch.device("cpu")
        timeout = datetime.timedelta(seconds=timeout_s)
        store = c10d.PrefixStore("tp", store)
        group: Any
        if device.type == "cuda":
            nccl: Any = getattr(c10d, "ProcessGroupNCCL", None)
            if nccl is None:
                raise InvalidParallelism("--tp on CUDA needs a torch built with NCCL")
            torch.cuda.set_device(device)
            options = nccl.Options()
            options._timeout = timeout
            group = nccl(store, rank, world_size, options)
        else:
            options = c10d.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._timeout = timeout
            options._devices = [c10d.ProcessGroupGloo.create_device(hostname=HOST)]
            group = c10d.ProcessGroupGloo(store, rank, world_size, options)
        self._group = group

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place; returns `t`. On the CPU a non-fp32 tensor is
        summed in fp32 (each rank's partial is rounded once, not each partial sum)."""
        if t.device.type == "cpu" and t.dtype != torch.float32:
            wide = t.float()
            self._group.allreduce([wide]).wait()
            return t.copy_(wide)
        if not t.is_contiguous():
            raise ValueError("all_reduce needs a contiguous tensor")
        self._group.allreduce([t]).wait()
        return t

    def broadcast_object(self, obj: object = None) -> object:
        """Rank 0's `obj` on every rank (rank 0 passes it; the others get it back)."""
        size = torch.zeros(1, dtype=torch.int64, device=self.comm_device)
        payload = None
        if self.rank == 0:
            payload = _encode(obj, self.comm_device)
            size.fill_(payload.numel())
        self._broadcast(size)
        if payload is None:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.comm_device)
        self._broadcast(payload)
        return obj if self.rank == 0 else _decode(payload)

    def send_object(self, obj: object, dst: int, tag: int = 0) -> None:
        payload = _encode(obj, self.comm_device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=self.comm_device)
        self._group.send([size], dst, 2 * tag).wait()
        self._group.send([payload], dst, 2 * tag + 1).wait()

    def recv_object(self, src: int, tag: int = 0) -> object:
        size = torch.zeros(1, dtype=torch.int64, device=self.comm_device)
        self._group.recv([size], src, 2 * tag).wait()
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.comm_device)
        self._group.recv([payload], src, 2 * tag + 1).wait()
        return _decode(payload)

    def _broadcast(self, t: torch.Tensor) -> None:
        options = c10d.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self._group.broadcast([t], options).wait()


def _encode(obj: object, device: torch.device) -> torch.Tensor:
    data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return torch.frombuffer(data, dtype=torch.uint8).to(device)


def _decode(payload: torch.Tensor) -> object:
    return pickle.loads(payload.cpu().numpy().tobytes())
