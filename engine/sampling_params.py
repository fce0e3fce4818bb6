"""Per-request sampling options. Plain data (no torch), so it can cross the process boundary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequest


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy. top_k 0 means no top-k cut; top_p 1.0 no nucleus cut. `seed` makes
    a sampled request reproducible whatever else shares its batch. `stop_token_ids` end generation
    (the token itself is not returned as text); `stop` strings end it and are cut from the text.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs to return per token, None for none

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequest(f"logprobs must be in [0, 20], got {self.logprobs}")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "seed": self.seed, "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids), "ignore_eos": self.ignore_eos,
            "logprobs": self.logprobs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> SamplingParams:
        known: dict[str, Any] = {k: v for k, v in data.items() if k in _FIELDS}
        for key in ("stop", "stop_token_ids"):
            if key in known:
                known[key] = tuple(known[key])
        return cls(**known)


_FIELDS = frozenset(SamplingParams.__dataclass_fields__)
