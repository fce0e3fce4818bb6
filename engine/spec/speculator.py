"""Speculative decoding inside the engine step: drafts before scheduling, exact verification
after the forward. The engine owns one `Speculator` when drafting is on (`EngineConfig.spec`).

Draft tokens ride in the same flattened forward as other requests' decodes and prefill chunks: a
decoding request with k drafts is scheduled as 1 + k rows and gets k + 1 logit rows back.
Rejected drafts' KV needs no undo: the request's `num_computed` only advances over accepted
tokens, so their slots are simply overwritten by the next step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.sampling import TokenChoice
from engine.spec.drafter import Drafter, DraftTree, FeatureDrafter, TreeDrafter
from engine.spec.gate import DraftGate, DraftGateConfig
from engine.spec.grammar_prune import prune_draft
from engine.spec.verify import RowMasker, verify_draft
from engine.spec.verify_tree import verify_tree

if TYPE_CHECKING:
    from engine.core import Request
    from engine.scheduler.scheduler import ScheduledItem

# Picks tokens for rows without drafts (the engine's plain path: grammar masks, batched argmax).
PlainChooser = Callable[[torch.Tensor, list["Request"]], list[TokenChoice]]


@dataclass(frozen=True)
class Verified:
    request: Request
    choices: list[TokenChoice]
    num_accepted: int  # leading choices whose KV the verify forward already wrote
    num_drafted: int = 0
    # Tree drafts: the step's rows (0: the last real token) whose KV holds the accepted
    # nodes, in path order; the engine moves them to consecutive positions. Empty: in place.
    kv_rows: tuple[int, ...] = ()


class Speculator:
    def __init__(self, drafter: Drafter, max_draft_len: int,
                 gate: DraftGateConfig | None = None) -> None:
        self.drafter = drafter
        # A drafter on the target's own features (EAGLE-3) names the layers the target's
        # forward captures for it, and takes them through `record_features`.
        self.features = drafter if isinstance(drafter, FeatureDrafter) else None
        self.capture_layers: tuple[int, ...] = (
            tuple(self.features.capture_layers) if self.features else ())
        # A drafter that may propose trees, verified under a tree attention mask.
        self.trees = drafter if isinstance(drafter, TreeDrafter) else None
        self.draws_trees = self.trees is not None and self.trees.draws_trees
        self.max_draft_len = max_draft_len
        # A drafter that gates itself (per source) replaces the request-level gate.
        self.gate = DraftGate(DraftGateConfig(max_skip=0) if getattr(
            drafter, "gates_itself", False) else gate)
        self.num_drafted = 0
        self.num_accepted = 0
        # Verifications by how many draft tokens they accepted (acceptance by depth: the
        # share of verifications that accepted at least d).
        self.accepted_lens: Counter[int] = Counter()

    def propose(self, running: Sequence[Request], max_context: int) -> None:
        """Set `draft_ids` on every decoding request (empty where there is nothing to guess, or
        where the gate skips drafting after misses)."""
        eligible, max_lens = [], []
        for req in running:
            req.draft_ids, req.draft_parents = [], None
            if not req.is_decoding:
                continue
            room = min(req.params.max_tokens - len(req.output_ids) - 1,
                       max_context - req.seq_len - 1, self.max_draft_len)
            if room > 0 and self.gate.allow(req.request_id):
                eligible.append(req)
                max_lens.append(room)
        if not eligible:
            return
        drafts: Sequence[DraftTree | list[int]] = (
            self.trees.propose_trees(eligible, max_lens) if self.trees is not None
            else self.drafter.propose(eligible, max_lens))
        for req, draft in zip(eligible, drafts, strict=True):
            token_ids = list(draft.token_ids if isinstance(draft, DraftTree) else draft)
            chain = list(range(-1, len(token_ids) - 1))
            parents = list(draft.parents) if isinstance(draft, DraftTree) else chain
            if req.grammar is not None and token_ids:
                # Tokens the grammar forbids could never be accepted: not worth a row.
                token_ids, parents = prune_draft(req.grammar, token_ids, parents)
                chain = chain[: len(token_ids)]
            req.draft_ids = token_ids
            # A tree that is a chain verifies as one (no mask, no KV moves).
            req.draft_parents = parents if parents != chain else None
            if not req.draft_ids:
                self.gate.observe(req.request_id, 0, 0)

    def choose(self, items: Sequence[ScheduledItem], logits: torch.Tensor,
               plain: PlainChooser, mask: RowMasker | None = None) -> list[Verified]:
        """items: the sampled items in order; logits: 1 + num_draft rows per item. `mask`
        applies a request's grammar to a row (needed once any request has a grammar)."""
        starts, row = [], 0
        for item in items:
            starts.append(row)
            row += 1 + item.num_draft
        plain_idx = [i for i, item in enumerate(items) if not item.num_draft]
        plain_choices = iter(plain(logits[[starts[i] for i in plain_idx]],
                                   [items[i].request for i in plain_idx])
                             if plain_idx else [])
        out = []
        for item, start in zip(items, starts, strict=True):
            req = item.request
            if not item.num_draft:
                out.append(Verified(req, [next(plain_choices)], 0))
                continue
            draft = req.draft_ids[: item.num_draft]
            rows = logits[start : start + item.num_draft + 1]
            kv_rows: tuple[int, ...] = ()
            if req.draft_parents is None:
                choices, num_accepted = verify_draft(rows, draft, req.params, req.generator,
                                                     req.grammar, mask)
            else:
                choices, path = verify_tree(rows, draft, req.draft_parents[: item.num_draft],
                                            req.params, req.generator, req.grammar, mask)
                num_accepted = len(path)
                # Row r of the step holds node r - 1; the path's rows move to positions
                # start + 1, start + 2, ... where the next steps expect them.
                kv_rows = tuple(node + 1 for node in path)
                if self.features is not None:
                    self.features.accept_rows(req, item.start, kv_rows)
            self.drafter.observe(req, len(draft), num_accepted)
            self.gate.observe(req.request_id, len(draft), num_accepted)
            self.accepted_lens[num_accepted] += 1
            out.append(Verified(req, choices, num_accepted, len(draft), kv_rows))
        for item in items:
            item.request.draft_ids, item.request.draft_parents = [], None
        return out

    def record_features(self, items: Sequence[ScheduledItem], aux: torch.Tensor) -> None:
        """Hand the forward's captured rows (`capture_layers`, batch order) to the drafter."""
        if self.features is not None:
            self.features.record_features(items, aux)

    def record(self, request: Request, num_drafted: int, num_emitted: int) -> None:
        """Count draft tokens proposed, and accepted ones as they reach the output (a stop
        inside a draft ends the request before the rest, which then do not count)."""
        request.num_drafted += num_drafted
        request.num_accepted += num_emitted
        self.num_drafted += num_drafted
        self.num_accepted += num_emitted

    def finish(self, request: Request) -> None:
        self.drafter.finish(request)
        self.gate.forget(request.request_id)

    def check_invariants(self) -> None:
        assert 0 <= self.num_accepted <= self.num_drafted
        self.drafter.check_invariants()
        self.gate.check_invariants()
