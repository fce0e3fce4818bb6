"""Peer adapters: the registry never fails on a missing engine; installed peers generate tokens."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.peers import Peer, available_peers, registry
from benchmarks.peers.base import timed_decode_tok_s
from engine.errors import ModelNotFound
from engine.models.locate import embedded_gguf_path

# "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's vocabulary:
# a chat prompt, so the first greedy token is an answer rather than <|im_end|> (the EOS id).
SHORT_PROMPT = [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]


def _gguf_or_skip() -> Path:
    try:
        return embedded_gguf_path()
    except ModelNotFound as exc:
        pytest.skip(str(exc))


def _fail_engine_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import name` raise ImportError, installed or not.
    for spec in registry.PEER_SPECS:
        monkeypatch.setitem(sys.modules, spec.requires, None)


def test_available_peers_returns_empty_list_and_notes_when_engines_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fail_engine_imports(monkeypatch)
    peers = available_peers("/nonexistent.gguf", threads=2, include_prompt_lookup=True)
    assert peers == []
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == len(registry.PEER_SPECS)
    for spec, note in zip(registry.PEER_SPECS, notes, strict=True):
        assert note.startswith(f"{spec.name} not installed (pip install '.[bench]')")


def test_available_peers_skips_a_peer_that_fails_to_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> Peer:
        raise RuntimeError("corrupt model")

    monkeypatch.setattr(registry, "load_factory", lambda spec, skipped: broken)
    skipped: list[str] = []
    assert available_peers("/nonexistent.gguf", skipped=skipped) == []
    assert "corrupt model" in capsys.readouterr().err
    assert len(skipped) == len(registry.PEER_SPECS)
    assert all("corrupt model" in note for note in skipped)


def test_timed_decode_rate_counts_tokens_after_the_first_callback() -> None:
    # First callback at 1.0 s carries prefill; then 4 more tokens (2 callbacks) in 0.5 s.
    assert timed_decode_tok_s([1.0, 1.25, 1.5], [1, 3, 5]) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        timed_decode_tok_s([1.0], [1])


def _installed_spec_params() -> list[object]:
    params: list[object] = []
    for spec in registry.PEER_SPECS:
        # OpenVINO's first GGUF load converts the model: several seconds, so it is "slow".
        marks = [pytest.mark.slow] if spec.name == "openvino-genai" else []
        missing = importlib.util.find_spec(spec.requires) is None
        if missing:
            marks.append(pytest.mark.skip(reason=f"{spec.name} not installed"))
        params.append(pytest.param(spec.name, marks=marks, id=spec.name))
    return params


@pytest.fixture(params=_installed_spec_params())
def peer(request: pytest.FixtureRequest) -> Iterator[Peer]:
    gguf = _gguf_or_skip()
    peers = available_peers(gguf, threads=2, names={request.param})
    assert len(peers) == 1, f"{request.param} is installed but failed to load"
    yield peers[0]
    peers[0].close()


def test_peer_greedy_output_is_token_ids_and_prefix_cache_is_used(peer: Peer) -> None:
    assert isinstance(peer, Peer)
    assert peer.load_s > 0
    out = peer.generate_greedy(SHORT_PROMPT, 8)
    assert 0 < len(out) <= 8
    assert all(isinstance(t, int) and 0 <= t < 49152 for t in out)
    # Greedy is deterministic, cached or not.
    peer.reset_cache()
    assert peer.generate_greedy(SHORT_PROMPT, 8) == out
    assert peer.ttft(SHORT_PROMPT) > 0
    peer.ttft(SHORT_PROMPT + out)
    if peer.last_cached_len is not None:
        assert peer.last_cached_len >= len(SHORT_PROMPT)
