"""An operator-declared public prefix (a common system prompt), shared across cache namespaces.

Namespaces never share nodes; they may share pages, only through the public namespace
(`engine.cache.base.PUBLIC_NAMESPACE`), and only for the leading tokens a request declares
public (`Request.shared_len`, from `Extend.shared_prefix_len`: the gateway checked them against
the operator's prefix). With P = the declared prefix's whole pages:

    admit    the public tree's cached pages of P (restored from the KV tiers first, like any
             namespace's) are grafted into the request's namespace at the root: inserted there
             as that namespace's own path, each page one more pool reference (refcount, no
             copy). The request then matches in its own namespace as always.
    finish   the request's pages of P are inserted into the public tree too (the rest of its
             path only into its own namespace), so the next tenant's request finds them.

       public tree    root ── P[0..k)
                               │ the same pages, one pool reference per tree
       tenant tree    root ── P[0..k) ── this tenant's turns (never in the public tree)

A namespace's tree is only ever seeded with pages of tokens that were declared public, at the
same positions, so what one tenant can match of another's work is the public prefix and nothing
after it. Each tree evicts its copy on its own; a page returns to the pool when the last tree
(or request) lets it go. Not with sliding-window memory: shared_len is ignored there.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.cache.base import PUBLIC_NAMESPACE, PrefixCache
from engine.cache.host_tier import KVTier, restore
from engine.cache.page_pool import PagePool
from engine.core import Request


def num_shared_pages(req: Request, page_size: int, limit: int) -> int:
    """Whole pages of the request's declared public prefix, at most `limit`."""
    return max(0, min(min(req.shared_len, len(req.prompt_ids)) // page_size, limit))


def adopt(cache: PrefixCache, pool: PagePool, tiers: Sequence[KVTier], req: Request,
          limit: int) -> int:
    """Seed the request's namespace with the public tree's pages of its declared prefix (at
    most `limit` pages). Returns the number of pages grafted."""
    page_size = cache.page_size
    num_pages = num_shared_pages(req, page_size, limit)
    if num_pages == 0:
        return 0
    prefix = req.all_ids[: num_pages * page_size]
    for tier in tiers:
        restore(tier, cache, pool, PUBLIC_NAMESPACE, prefix, num_pages)
    public = cache.match_prefix(PUBLIC_NAMESPACE, prefix)
    if public.cached_len <= cache.cached_prefix_len(req.namespace, prefix):
        return 0
    return cache.insert(req.namespace, prefix[: public.cached_len], public.page_ids).num_new_pages


def publish(cache: PrefixCache, req: Request, page_ids: Sequence[int], num_full: int) -> None:
    """Insert the request's pages of its declared prefix (of its first `num_full` computed
    pages) into the public tree."""
    num_pages = num_shared_pages(req, cache.page_size, num_full)
    if num_pages:
        cache.insert(PUBLIC_NAMESPACE, req.all_ids[: num_pages * cache.page_size],
                     page_ids[:num_pages])
