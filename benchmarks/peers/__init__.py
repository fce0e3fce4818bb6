"""Peer engines that benchmarks run side by side with radixgate on the same GGUF.

Each peer lives in its own module and imports its engine lazily; `registry.available_peers` returns
only the installed ones (install them with `pip install '.[bench]'`).
"""

from benchmarks.peers.base import Peer, timed_decode_tok_s
from benchmarks.peers.registry import available_peers

__all__ = ["Peer", "available_peers", "timed_decode_tok_s"]
