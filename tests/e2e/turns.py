"""Drive an engine through a tree of turns the way the gateway does, and the same turns through
the dense reference, so tests can compare the outputs token for token."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.engine import Engine
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished, Message, TokenChunk
from engine.reference import reference_generate
from engine.sampling_params import SamplingParams

NAMESPACE = "test:smollm2"


@dataclass
class Turn:
    turn_id: str
    path: list[int]  # the full token path bound to this turn (prompt + output [+ stop token])
    output_ids: list[int]
    finished: Finished


@dataclass
class TurnDriver:
    """Runs turns on an engine. With the prefix cache on, sends the delta and the parent turn id;
    with it off (or `full_path=True`), sends the full path, as the gateway's fallback does."""

    engine: Engine
    full_path: bool = False
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, parent: Turn | None, delta: list[int], params: SamplingParams) -> str:
        request_id = f"req-{next(self.ids)}"
        if parent is None or self.full_path:
            tokens = (parent.path if parent else []) + delta
            extend = Extend(request_id, NAMESPACE, None, tokens, params, bind_turn_id=request_id)
        else:
            extend = Extend(request_id, NAMESPACE, parent.turn_id, delta, params,
                            bind_turn_id=request_id)
        failed = self.engine.submit(extend)
        assert not failed, failed
        return request_id

    def collect(self, messages: list[Message]) -> dict[str, Turn]:
        outputs: dict[str, list[int]] = {}
        turns: dict[str, Turn] = {}
        for m in messages:
            assert not isinstance(m, Failed), m
            if isinstance(m, TokenChunk):
                outputs.setdefault(m.request_id, []).extend(m.token_ids)
            elif isinstance(m, Finished):
                assert m.output_token_ids == outputs.get(m.request_id, [])
                turns[m.request_id] = Turn(m.request_id, [], m.output_token_ids, m)
        return turns

    def run(self, parent: Turn | None, delta: list[int], params: SamplingParams) -> Turn:
        request_id = self.submit(parent, delta, params)
        turn = self.collect(self.engine.run_until_idle())[request_id]
        turn.path = self.path_of(parent, delta, turn)
        return turn

    @staticmethod
    def path_of(parent: Turn | None, delta: list[int], turn: Turn) -> list[int]:
        path = (parent.path if parent else []) + delta + turn.output_ids
        if turn.finished.stop_token_id is not None:
            path.append(turn.finished.stop_token_id)
        return path


def reference_turn(loaded: LoadedModel, parent_path: list[int], delta: list[int],
                   params: SamplingParams) -> list[int]:
    return reference_generate(loaded.model, parent_path + delta, params,
                              eos_token_ids=loaded.tokenizer.stop_token_ids)
