"""KV pages in files, so a restarted worker starts warm: branch heads the gateway pins are
written out, and a worker loads them on first use instead of recomputing.

    <dir>/<model fingerprint>/<page key hex>.kv    one page: K then V of every layer, raw

The page key is `host_tier.page_keys`' hash chain of the token path (namespace included), so
the file names say which prefix they hold and any worker of the same model (same fingerprint:
model, vocabulary, dtype, KV shape, page size) may load them. Files are written to a temporary
name and renamed, so a reader never sees half a page; a file of the wrong size is ignored and
deleted. The directory is bounded by `max_bytes`: the oldest files go first.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from engine.cache.host_tier import page_keys
from engine.kv_pool import KVPool


class DiskTier:
    def __init__(self, kv_pool: KVPool, root: Path, fingerprint: str, max_bytes: int) -> None:
        self.kv_pool = kv_pool
        self.page_size = kv_pool.layout.page_size
        self.dir = root / fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        k = kv_pool.k[0]
        self._page_shape = (2 * len(kv_pool.k), *k.shape[1:])
        self.page_bytes = int(np.prod(self._page_shape)) * k.element_size()
        self.max_pages = max(1, max_bytes // self.page_bytes)
        files = sorted(self.dir.glob("*.kv"), key=lambda p: p.stat().st_mtime)
        self._files: OrderedDict[bytes, None] = OrderedDict(
            (bytes.fromhex(p.stem), None) for p in files if p.stat().st_size == self.page_bytes)
        self.num_written = 0
        self.num_loaded = 0

    @staticmethod
    def fingerprint(model_name: str, vocab_hash: str, kv_pool: KVPool) -> str:
        k = kv_pool.k[0]
        text = f"{model_name}|{vocab_hash}|{k.dtype}|{len(kv_pool.k)}|{tuple(k.shape[1:])}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __contains__(self, key: bytes) -> bool:
        return key in self._files

    def touch(self, key: bytes) -> None:
        self._files.move_to_end(key)

    def save_path(self, namespace: str, token_ids: list[int], page_ids: list[int]) -> int:
        """Write the pages of a cached path (`page_ids`, one per whole page of `token_ids`)
        that are not on disk yet. Returns the number written."""
        written = 0
        for key, page_id in zip(page_keys(namespace, token_ids, self.page_size, len(page_ids)),
                                page_ids, strict=True):
            if key in self._files:
                self._files.move_to_end(key)
                continue
            self._write(key, page_id)
            written += 1
        while len(self._files) > self.max_pages:
            old, _ = self._files.popitem(last=False)
            self._path(old).unlink(missing_ok=True)
        return written

    def load(self, key: bytes, device_page: int) -> bool:
        path = self._path(key)
        try:
            raw = np.fromfile(path, dtype=np.uint8)
        except OSError:
            self._files.pop(key, None)
            return False
        if raw.size != self.page_bytes:
            self._files.pop(key, None)
            path.unlink(missing_ok=True)
            return False
        page = torch.from_numpy(raw).view(self.kv_pool.k[0].dtype).view(self._page_shape)
        num_layers = len(self.kv_pool.k)
        for layer in range(num_layers):
            self.kv_pool.k[layer][device_page].copy_(page[layer])
            self.kv_pool.v[layer][device_page].copy_(page[num_layers + layer])
        self.num_loaded += 1
        return True

    def check_invariants(self) -> None:
        assert len(self._files) <= self.max_pages, "disk tier over its bound"

    def _write(self, key: bytes, page_id: int) -> None:
        page = torch.stack([k[page_id] for k in self.kv_pool.k]
                           + [v[page_id] for v in self.kv_pool.v]).cpu().contiguous()
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        page.view(torch.uint8).numpy().tofile(tmp)
        os.replace(tmp, path)
        self._files[key] = None
        self.num_written += 1

    def _path(self, key: bytes) -> Path:
        return self.dir / f"{key.hex()}.kv"
