"""Pages received from a prefill worker, waiting for their request's admission.

One more `KVTier`: the scheduler's `restore` at admission finds the pages under their
`page_keys`, copies them into fresh pool pages and the radix cache, and the request is admitted
over them as over any cached prefix. A page is loaded once and then dropped; the inbox holds at
most `max_pages` (oldest dropped first: a dropped page is recomputed, never wrong).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from engine.kv_pool import KVPool


class InboxTier:
    def __init__(self, kv_pool: KVPool, max_pages: int) -> None:
        if max_pages < 1:
            raise ValueError(f"a KV inbox needs at least one page, got {max_pages}")
        self.kv_pool = kv_pool
        self.page_size = kv_pool.layout.page_size
        self.max_pages = max_pages
        self.num_layers = len(kv_pool.k)
        self._pages: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # key -> (2L, *page)
        self.num_received = 0  # pages put in
        self.num_loaded = 0  # pages moved into the pool
        self.num_dropped = 0  # pages dropped unused (inbox full)

    def __contains__(self, key: bytes) -> bool:
        return key in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def put(self, keys: Sequence[bytes], payload: torch.Tensor) -> None:
        """Hold `payload[i]` (K of every layer, then V) under `keys[i]`."""
        if payload.shape[0] != len(keys) or payload.shape[1] != 2 * self.num_layers:
            raise ValueError(f"payload {tuple(payload.shape)} does not match {len(keys)} "
                             f"pages of {self.num_layers} layers")
        for key, page in zip(keys, payload, strict=True):
            self._pages.pop(key, None)
            self._pages[key] = page
            self.num_received += 1
        while len(self._pages) > self.max_pages:
            self._pages.popitem(last=False)
            self.num_dropped += 1

    def touch(self, key: bytes) -> None:
        self._pages.move_to_end(key)

    def load(self, key: bytes, device_page: int) -> bool:
        page = self._pages.pop(key)
        for layer in range(self.num_layers):
            self.kv_pool.k[layer][device_page].copy_(page[layer])
            self.kv_pool.v[layer][device_page].copy_(page[self.num_layers + layer])
        self.num_loaded += 1
        return True

    def check_invariants(self) -> None:
        assert len(self._pages) <= self.max_pages, "the inbox holds more than its bound"
        expected = (2 * self.num_layers, *self.kv_pool.k[0].shape[1:])
        for page in self._pages.values():
            assert tuple(page.shape) == expected, "an inbox page of the wrong shape"
        assert self.num_loaded + self.num_dropped + len(self._pages) <= self.num_received
