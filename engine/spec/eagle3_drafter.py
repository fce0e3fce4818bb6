"""The EAGLE-3 drafter, as a chain: a head on the target's own features guesses the next tokens.

The target forward the engine already runs captures the residual streams entering the head's
layers (`ModelRunner.run_captured`); `record_features` keeps each computed position's row. The
head's input at position p is (the target's features at p, token p + 1) and it predicts token
p + 2, so once the target has computed position p and token p + 1 is known, the head can take p.

    propose   per request, one batched head pass over the positions computed since its last
              proposal (their features, the tokens after them), then greedy draft steps: step 1
              reads the last extended position's logits, step j feeds step j - 1's token with
              its hidden output at the next position. The head KV of the draft steps is cut
              away afterwards, so the cache only ever holds positions of real tokens.

Rows of rejected draft tokens are never extended into the head: a position's features count only
once the engine has computed it (`num_computed` moves over accepted tokens only).

Prefix-cache hits: positions the hit skipped have no features in this request. An agent's next
turn hits the cache on its session's previous turn, so the head's KV of a finished request is
kept per session (`HeadKVCache`, LRU) and a new request of that session adopts it for the
longest common token prefix less one position: the head's row at position p read token p + 1,
which is only the same where the next token is too (the boundary SGLang keys its radix cache by
bigrams for). Where the adopted rows and this request's computed positions leave a gap, the head
starts over at the first computed position and attends to what it has (drafts may be weaker;
verification keeps the output exact either way). Correctness never depends on the head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.spec.drafter import DraftTree
from engine.spec.eagle3_head import Eagle3Head, HeadKV
from engine.spec.eagle3_tree import TreeShape, TreeStart, draft_trees

if TYPE_CHECKING:
    from engine.core import Request
    from engine.scheduler.scheduler import ScheduledItem


@dataclass(eq=False)
class _HeadSeq:
    """One request's head state: its KV over positions [first_pos, next_pos), the captured
    features of computed positions not yet extended (by position), and the last extended
    position's logits and hidden output."""

    kv: HeadKV
    features: dict[int, torch.Tensor] = field(default_factory=dict)
    next_pos: int = -1  # the next position to extend (-1: none yet)
    last_logits: torch.Tensor | None = None
    last_hidden: torch.Tensor | None = None


@dataclass(frozen=True)
class _Kept:
    """A finished request's head KV and the tokens it covers (token_ids[p + 1] read at p)."""

    token_ids: tuple[int, ...]
    kv: HeadKV
    first_pos: int  # the position of the KV's first row
    next_pos: int


class HeadKVCache:
    """Per (namespace, session): the head KV of the session's last finished request. LRU of
    `max_sessions`."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()

    def put(self, key: tuple[str, str], kept: _Kept) -> None:
        self._kept[key] = kept
        self._kept.move_to_end(key)
        while len(self._kept) > self.max_sessions:
            self._kept.popitem(last=False)

    def take(self, key: tuple[str, str]) -> _Kept | None:
        return self._kept.pop(key, None)

    def __len__(self) -> int:
        return len(self._kept)


DEFAULT_KEPT_SESSIONS = 16  # head KV of 8k tokens is ~12 MB in fp32 for SmolLM2's head
# Captured positions kept for a head that is not drafting (the suffix drafter took the request,
# or the head does not pay): 3 layers of fp32 are ~7 KB a position for SmolLM2, so an idle
# head keeps the last 256, and one that drafts again starts over from them (a bounded
# catch-up, with less context) rather than read a whole long prompt.
MAX_PENDING_FEATURES = 256


class Eagle3Drafter:
    name = "eagle3"

    def __init__(self, head: Eagle3Head, max_draft_len: int,
                 max_kept_sessions: int = DEFAULT_KEPT_SESSIONS,
                 tree: TreeShape | None = None) -> None:
        """`tree`: draft trees of that shape (`propose_trees`); None or topk 1: chains."""
        self.head = head
        self.max_draft_len = max_draft_len
        self.tree = tree if tree is not None and tree.topk > 1 else None
        self.capture_layers = head.config.captured_layer_ids
        self._seqs: dict[str, _HeadSeq] = {}
        self.kept = HeadKVCache(max_kept_sessions)

    def record_features(self, items: Sequence[ScheduledItem], aux: torch.Tensor) -> None:
        """Keep the captured rows of each scheduled item (batch order), by position. Rows of
        draft tokens are kept too and dropped unless the engine computes those positions."""
        offset = 0
        for item in items:
            seq = self._seqs.get(item.request.request_id)
            if seq is None:
                seq = self._seqs[item.request.request_id] = self._adopt(item.request)
            for i in range(item.num_tokens):
                if item.start + i >= seq.next_pos:  # earlier ones the head has (adopted KV)
                    seq.features[item.start + i] = aux[offset + i]
            offset += item.num_tokens
            if len(seq.features) > MAX_PENDING_FEATURES:
                newest = max(seq.features)
                for p in [p for p in seq.features if p <= newest - MAX_PENDING_FEATURES]:
                    del seq.features[p]

    @property
    def draws_trees(self) -> bool:
        return self.tree is not None

    def propose_trees(self, requests: list[Request], max_lens: list[int]
                      ) -> list[DraftTree | list[int]]:
        """Trees of the drafter's shape (`engine.spec.eagle3_tree`), or chains without one."""
        if self.tree is None:
            return list(self.propose(requests, max_lens))
        out: list[DraftTree | list[int]] = [[] for _ in requests]
        live = self._extend_drafting(requests, max_lens)
        starts = []
        for i in live:
            seq = self._seqs[requests[i].request_id]
            assert seq.last_logits is not None and seq.last_hidden is not None
            starts.append(TreeStart(seq.last_logits, seq.last_hidden, seq.kv,
                                    requests[i].seq_len))
        trees = draft_trees(self.head, starts, [max_lens[i] for i in live], self.tree)
        for i, tree in zip(live, trees, strict=True):
            out[i] = tree
        return out

    def accept_rows(self, request: Request, start: int, rows: Sequence[int]) -> None:
        """The features of the accepted tree nodes' rows move to their positions; those of
        the other rows are dropped."""
        seq = self._seqs.get(request.request_id)
        if seq is None:
            return
        moved = [seq.features.get(start + row) for row in rows]
        for p in [p for p in seq.features if p > start]:
            del seq.features[p]
        for i, features in enumerate(moved):
            if features is not None:
                seq.features[start + 1 + i] = features

    def propose(self, requests: list[Request], max_lens: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        live = self._extend_drafting(requests, max_lens)
        if not live:
            return drafts
        seqs = [self._seqs[requests[i].request_id] for i in live]
        logits = torch.stack([s.last_logits for s in seqs if s.last_logits is not None])
        hidden = torch.stack([s.last_hidden for s in seqs if s.last_hidden is not None])
        positions = torch.tensor([requests[i].seq_len for i in live], dtype=torch.long)
        kept = [s.kv.num_tokens for s in seqs]
        steps = max(max_lens[i] for i in live)
        for step in range(steps):
            tokens = self.head.top_k(logits, 1).token_ids[:, 0]
            for row, i in enumerate(live):
                if step < max_lens[i]:
                    drafts[i].append(int(tokens[row]))
            if step + 1 == steps:
                break
            # The head's next position is seq_len - 1 + step: its token is the one just
            # drafted, its features the head's own output (the target has not computed it).
            out = self.head.forward(tokens, hidden, positions - 1 + step,
                                    [s.kv for s in seqs], [1] * len(seqs))
            logits, hidden = out.logits, out.hidden
        for seq, num_tokens in zip(seqs, kept, strict=True):
            seq.kv.truncate(num_tokens)  # draft positions are guesses, never kept
        return drafts

    def _extend_drafting(self, requests: list[Request], max_lens: list[int]) -> list[int]:
        """Extend the heads of the requests that have room to draft; the indices of those
        ready to draft. The others' features wait: a head that is not drafting (the suffix
        drafter took the request, or the gate skips it) costs nothing per step, and catches
        up over every waiting position in one pass when it drafts again."""
        drafting = [i for i, room in enumerate(max_lens) if room > 0]
        ready = self._extend([requests[i] for i in drafting])
        return [drafting[j] for j in ready]

    def _extend(self, requests: list[Request]) -> list[int]:
        """Extend each request's head over its newly computed positions (one batched pass);
        the indices of the requests whose last computed position is extended."""
        batch: list[tuple[int, _HeadSeq, list[int]]] = []
        for i, req in enumerate(requests):
            seq = self._seqs.get(req.request_id)
            # The head can take a computed position once the token after it is known (a
            # finished request's last computed position may be followed by nothing: a stop).
            last = min(req.num_computed, len(req.all_ids) - 1) - 1
            if seq is None or seq.next_pos == last + 1:
                continue
            if 0 <= seq.next_pos <= last and all(p in seq.features
                                                 for p in range(seq.next_pos, last + 1)):
                start = seq.next_pos
            elif last in seq.features:
                start = self._restart(seq, last)
            else:
                continue  # nothing captured at the last position: not drafted this step
            batch.append((i, seq, list(range(start, last + 1))))
        if batch:
            ids = [requests[i].all_ids for i, _, _ in batch]
            tokens = torch.tensor([ids[k][p + 1] for k, (_, _, pos) in enumerate(batch)
                                   for p in pos], dtype=torch.long)
            features = torch.stack([seq.features[p] for _, seq, pos in batch for p in pos])
            positions_t = torch.tensor([p for _, _, pos in batch for p in pos], dtype=torch.long)
            out = self.head.forward(tokens, features, positions_t, [s.kv for _, s, _ in batch],
                                    [len(pos) for _, _, pos in batch])
            end = 0
            for _, seq, pos in batch:
                end += len(pos)
                seq.last_logits, seq.last_hidden = out.logits[end - 1], out.hidden[end - 1]
                seq.next_pos = pos[-1] + 1
        for req in requests:
            seq = self._seqs.get(req.request_id)
            if seq is not None:  # features up to the extended position are spent
                for p in [p for p in seq.features if p < seq.next_pos]:
                    del seq.features[p]
        return [i for i, req in enumerate(requests)
                if (seq := self._seqs.get(req.request_id)) is not None
                and seq.next_pos == req.num_computed and seq.last_logits is not None]

    def _restart(self, seq: _HeadSeq, last: int) -> int:
        """The first position of the contiguous run of features ending at `last` (the head
        starts over there: positions before it have no features, e.g. a prefix-cache hit)."""
        start = last
        while start - 1 in seq.features:
            start -= 1
        seq.kv.truncate(0)
        seq.next_pos = start
        return start

    def _adopt(self, req: Request) -> _HeadSeq:
        """A new request's head state: its session's kept KV over the common token prefix
        less one position (see the module docstring), else empty."""
        seq = _HeadSeq(self.head.new_kv())
        kept = self.kept.take((req.namespace, req.session_id)) if req.session_id else None
        if kept is None:
            return seq
        ids = req.all_ids
        common = 0
        limit = min(len(ids), len(kept.token_ids))
        while common < limit and ids[common] == kept.token_ids[common]:
            common += 1
        # Row p is valid while token p + 1 is shared: positions < common - 1.
        end = min(kept.next_pos, common - 1)
        if end > kept.first_pos:
            kept.kv.truncate(end - kept.first_pos)
            seq.kv, seq.next_pos = kept.kv, end
        return seq

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        """Nothing to undo: draft positions never stay in the head's cache."""

    def finish(self, request: Request) -> None:
        running = self._seqs.get(request.request_id)
        if request.session_id is not None and running is not None and running.next_pos > 0:
            # The last step's positions are in the prefix cache now: extend the head over
            # them too, or the session's next turn would start past the kept KV and lose it.
            # (A head that never ran for this request keeps nothing: no pass at the end.)
            self._extend([request])
        seq = self._seqs.pop(request.request_id, None)
        if seq is None or request.session_id is None or seq.next_pos <= 0:
            return
        first_pos = seq.next_pos - seq.kv.num_tokens
        self.kept.put((request.namespace, request.session_id),
                      _Kept(tuple(request.all_ids[: seq.next_pos + 1]), seq.kv, first_pos,
                            seq.next_pos))

    def check_invariants(self) -> None:
        for seq in self._seqs.values():
            seq.kv.check_invariants()
            assert seq.next_pos < 0 or all(p >= seq.next_pos for p in seq.features)
