"""Disaggregated prefill/decode: a decode worker has a prefill worker compute a long delta's KV
and receives its pages over torch.distributed (gloo on CPU) before decoding it.

    decode worker (KvPuller)                     prefill worker (KvServer)
      KvConnect(decode_key) ── ZeroMQ ──────────▶ hosts a TCPStore, answers KvAccept
      joins the 2-rank gloo group ◀────────────▶ joins it (rank 0)
      Extend with a long uncached delta: parked
      PrefillFor(tag, prompt pages) ── ZeroMQ ──▶ prefills them over its own radix cache,
                                                 copies pages first..n out, sends them
      header + payload ◀──────── gloo ───────────
      pages → InboxTier; the parked Extend is admitted: `restore` moves them into the pool

A transfer that never lands (peer dead, too slow) is recomputed by the decode worker: no request
waits on a peer for ever, and neither side holds a page for a transfer in flight.
"""
