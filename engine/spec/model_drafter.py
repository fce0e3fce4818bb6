"""The draft-model drafter: a smaller model with the same tokenizer guesses k tokens greedily.

It runs on its own small paged KV (no prefix cache): for each drafted request it keeps the token
ids whose draft KV is valid. Before proposing, that list is cut back to its common prefix with the
request's tokens (rejected guesses are rolled back this way), the missing tokens are extended in
one batched forward, then k - 1 batched greedy decode steps follow. A request whose draft KV does
not fit is simply not drafted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from engine.attention.registry import backend_for
from engine.cache.page_pool import PagePool
from engine.errors import InvalidRequest
from engine.kv_pool import KVPool, plan_kv_layout
from engine.model_runner import ModelRunner
from engine.scheduler.scheduler import ScheduledItem

if TYPE_CHECKING:
    from engine.core import Request
    from engine.models.loader import LoadedModel


@dataclass(eq=False)
class _DraftSeq:
    """The slice of a `Request` the model runner reads, for the draft model's own KV."""

    all_ids: list[int] = field(default_factory=list)  # tokens whose draft KV is (being) written
    page_ids: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)  # always empty: the runner needs it

    @property
    def seq_len(self) -> int:
        return len(self.all_ids)


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelDrafter:
    name = "draft_model"

    def __init__(self, draft: LoadedModel, max_draft_len: int,
                 kv_memory_bytes: int = 128 << 20, page_size: int = 16) -> None:
        model = draft.model
        self.max_draft_len = max_draft_len
        layout = plan_kv_layout(model.config, kv_memory_bytes, page_size, model.kv_dtype)
        self.page_size = page_size
        self.pool = PagePool(layout.num_pages)
        self.runner = ModelRunner(model, KVPool(model.config, layout, model.kv_dtype),
                                  backend_for("torch", model.attention_specs))
        self._seqs: dict[str, _DraftSeq] = {}

    @classmethod
    def from_path(cls, path: str, target: LoadedModel, max_draft_len: int) -> ModelDrafter:
        from engine.models.loader import load_model

        draft = load_model(path)
        same = (draft.tokenizer.vocab_size == target.tokenizer.vocab_size
                and dict(draft.tokenizer.special_tokens) == dict(target.tokenizer.special_tokens)
                and draft.model.config.vocab_size == target.model.config.vocab_size)
        if not same:
            raise InvalidRequest(f"draft model {path} does not share the target's tokenizer")
        return cls(draft, max_draft_len)

    def propose(self, requests: list[Request], max_lens: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        # Extend each sequence by what it lacks (at least its last token), then decode greedily.
        pending = {i: self._sync(req) for i, req in enumerate(requests)}
        targets = {i: req.all_ids for i, req in enumerate(requests)}
        for step in range(max(max_lens, default=0)):
            if not pending:
                break
            items = []
            for i, seq in pending.items():
                start = seq.seq_len
                seq.all_ids = list(targets[i]) if step == 0 else [*seq.all_ids, drafts[i][-1]]
                if not self._reserve(seq):
                    seq.all_ids = seq.all_ids[:start]
                    continue
                item = ScheduledItem(cast("Request", seq), start, seq.seq_len - start)
                items.append((i, item))
            if not items:
                break
            logits = self.runner.run([item for _, item in items])
            for (i, _), token_id in zip(items, torch.argmax(logits, dim=-1).tolist(),
                                        strict=True):
                drafts[i].append(int(token_id))
            pending = {i: pending[i] for i, _ in items if len(drafts[i]) < max_lens[i]}
        return drafts

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        """Nothing to adapt: the next `propose` rolls the draft KV back to the accepted tokens."""

    def finish(self, request: Request) -> None:
        seq = self._seqs.pop(request.request_id, None)
        if seq is not None and seq.page_ids:
            self.pool.decref(seq.page_ids)

    def check_invariants(self) -> None:
        owned = [p for seq in self._seqs.values() for p in seq.page_ids]
        assert len(owned) == len(set(owned)) == self.pool.num_used_pages
        for seq in self._seqs.values():
            assert len(seq.page_ids) * self.page_size >= seq.seq_len
        self.pool.check_invariants()

    # ----- internals -----

    def _sync(self, req: Request) -> _DraftSeq:
        """The request's draft sequence, cut back to the prefix it shares with the request
        (minus the last token, which is always re-run to get the next logits)."""
        seq = self._seqs.setdefault(req.request_id, _DraftSeq())
        keep = min(_common_prefix_len(seq.all_ids, req.all_ids), req.seq_len - 1)
        seq.all_ids = seq.all_ids[:keep]
        return seq

    def _reserve(self, seq: _DraftSeq) -> bool:
        need = -(-seq.seq_len // self.page_size) - len(seq.page_ids)
        if need <= 0:
            return True
        if need > self.pool.num_free_pages:
            return False
        seq.page_ids.extend(self.pool.alloc(need))
        return True
