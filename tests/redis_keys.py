"""Deleting a test's Redis keys: every fixture that writes under a key prefix cleans up here."""

from __future__ import annotations

from sessions.redis_client import open_sync_client


def delete_key_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under `prefix` (in batches of 500; on a cluster, from every primary)."""
    client = open_sync_client(redis_url)
    try:
        stale = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(stale), 500):
            client.unlink(*stale[start : start + 500])
    finally:
        client.close()
