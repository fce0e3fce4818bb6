"""The trajectory drafter: proposes the continuation of the longest recent match of the current
suffix, looked up in the request's own context (prompt + output so far), in what the same session
produced before (earlier turns' deltas and outputs, sibling branches), and in a bounded window of
the namespace's recent outputs. Agents re-emit file content, JSON keys and paths they have seen;
this finds them without a draft model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.spec.drafter import AdaptiveLength
from engine.spec.suffix_index import SuffixIndex

if TYPE_CHECKING:
    from engine.core import Request

SEPARATOR = -1  # between sequences of a corpus; never a real token, so never proposed


@dataclass(frozen=True)
class SuffixDrafterConfig:
    max_draft_len: int = 8
    max_session_tokens: int = 65_536  # per session corpus; the older half is dropped beyond it
    max_sessions: int = 256
    max_recent_tokens: int = 16_384  # per namespace window of recent outputs
    max_namespaces: int = 64


class _Corpus:
    """A bounded SuffixIndex over separated sequences; halves itself (oldest first) when full."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.index = SuffixIndex()

    def add(self, token_ids: list[int]) -> None:
        if not token_ids:
            return
        if len(self.index) + len(token_ids) + 1 > self.max_tokens:
            keep = self.index.token_ids[len(self.index.token_ids) // 2 :]
            self.index = SuffixIndex()
            self.index.add(keep[-(self.max_tokens // 2) :])
            token_ids = token_ids[-(self.max_tokens // 2) :]
        self.index.add([*token_ids, SEPARATOR])


@dataclass
class _RequestState:
    index: SuffixIndex = field(default_factory=SuffixIndex)
    draft_len: int | None = None


def _cut(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(SEPARATOR)] if SEPARATOR in tokens else tokens


class SuffixDrafter:
    name = "suffix"

    def __init__(self, config: SuffixDrafterConfig | None = None) -> None:
        self.config = config or SuffixDrafterConfig()
        self.lengths = AdaptiveLength(self.config.max_draft_len)
        self._requests: dict[str, _RequestState] = {}
        self._sessions: OrderedDict[tuple[str, str], _Corpus] = OrderedDict()
        self._recent: OrderedDict[str, _Corpus] = OrderedDict()

    def propose(self, requests: list[Request], max_lens: list[int]) -> list[list[int]]:
        return [tokens for _, tokens in self.propose_matched(requests, max_lens)]

    def propose_matched(self, requests: list[Request], max_lens: list[int]
                        ) -> list[tuple[int, list[int]]]:
        """`propose`, with the length of the match each draft continues (0: none): a long
        match is re-emitted text, where these drafts are usually right."""
        return [self._propose_one(req, max_len)
                for req, max_len in zip(requests, max_lens, strict=True)]

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        state = self._requests.get(request.request_id)
        if state is not None:
            state.draft_len = self.lengths.next_len(state.draft_len, num_drafted, num_accepted)

    def finish(self, request: Request) -> None:
        self._requests.pop(request.request_id, None)
        # What this request added to the trajectory: its new prompt tokens and its output.
        new_ids = request.all_ids[request.first_cached_len or 0 :]
        if request.session_id is not None:
            key = (request.namespace, request.session_id)
            corpus = self._lru(self._sessions, key, self.config.max_session_tokens,
                               self.config.max_sessions)
            corpus.add(new_ids)
        recent = self._lru(self._recent, request.namespace, self.config.max_recent_tokens,
                           self.config.max_namespaces)
        recent.add(list(request.output_ids))

    def check_invariants(self) -> None:
        for state in self._requests.values():
            state.index.check_invariants()
        for corpus in (*self._sessions.values(), *self._recent.values()):
            assert len(corpus.index) <= corpus.max_tokens + 1
            corpus.index.check_invariants()

    # ----- internals -----

    def _propose_one(self, req: Request, max_len: int) -> tuple[int, list[int]]:
        state = self._requests.setdefault(req.request_id, _RequestState())
        context = req.all_ids
        # Indexing registers each n-gram with its follower, so the current suffix itself (which
        # has none yet) never matches itself.
        state.index.add(context[len(state.index) :])
        limit = min(max_len, state.draft_len or self.lengths.initial)
        best_n, best = state.index.match(context, limit)
        sources = []
        if req.session_id is not None:
            sources.append(self._sessions.get((req.namespace, req.session_id)))
        sources.append(self._recent.get(req.namespace))
        for corpus in sources:
            if corpus is None:
                continue
            n, tokens = corpus.index.match(context, limit)
            tokens = _cut(tokens)
            if n > best_n and tokens:
                best_n, best = n, tokens
        return (best_n if best else 0), best

    @staticmethod
    def _lru(table: OrderedDict[Any, _Corpus], key: object, max_tokens: int,
             max_entries: int) -> _Corpus:
        corpus = table.get(key)
        if corpus is None:
            corpus = table[key] = _Corpus(max_tokens)
            while len(table) > max_entries:
                table.popitem(last=False)
        table.move_to_end(key)
        return corpus
