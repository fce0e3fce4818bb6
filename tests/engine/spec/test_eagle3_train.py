"""EAGLE-3 training: the trainable module computes `Eagle3Head`'s forward on the same weights, its
TTT unroll matches the chain drafter's geometry, and `radixgate train-draft` on the tiny target
writes a head that loads and drafts with greedy output unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.attention.dense import DenseAttention
from engine.models.loader import LoadedModel
from engine.sampling_params import SamplingParams
from engine.spec.eagle3_checkpoint import D2T, LM_HEAD, random_eagle3_head
from engine.spec.eagle3_data import Sample, capture_sample, draft_vocabulary
from engine.spec.eagle3_head import Eagle3Head, load_eagle3_head
from engine.spec.eagle3_prompts import training_prompts
from engine.spec.eagle3_train import TrainOptions, train_draft
from engine.spec.eagle3_trainable import TrainableEagle3Head
from tests.engine.spec.test_spec_engine import make_engine, repetitive_prompts, run

LAYERS = (0, 1)


def _pair(tiny: LoadedModel) -> tuple[Eagle3Head, TrainableEagle3Head]:
    ckpt = random_eagle3_head(tiny.model.config, 512, seed=5, scale=0.2, captured_layer_ids=LAYERS)
    embed = tiny.model.weights.embed
    head = Eagle3Head(ckpt.config, ckpt.tensors, embed, torch.float32)
    draft_ids = torch.arange(512) + ckpt.tensors[D2T]
    return head, TrainableEagle3Head(ckpt.config, ckpt.tensors, embed, draft_ids)


def _features(tiny: LoadedModel, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    _, aux = tiny.model.forward_captured(torch.tensor(ids), torch.arange(n),
                                         DenseAttention([n]), LAYERS)
    assert aux is not None
    return aux.clone()


def test_trainable_forward_equals_inference_head(tiny: LoadedModel) -> None:
    head, trainable = _pair(tiny)
    ids = repetitive_prompts(tiny)[1][:20]
    feats = _features(tiny, ids)
    tokens, positions = torch.tensor(ids[1:]), torch.arange(len(ids) - 1)
    ref = head.forward(tokens, feats[:-1], positions, [head.new_kv()], [len(ids) - 1])
    logits, hidden = trainable(tokens, feats[:-1], positions)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden, ref.hidden, atol=1e-5, rtol=1e-5)
    public = trainable.public_tensors(torch.float32)
    assert torch.equal(public[LM_HEAD], head.lm_head)
    assert torch.equal(torch.arange(512) + public[D2T], head.draft_to_target)


def test_ttt_step_k_is_the_chain_drafter(tiny: LoadedModel) -> None:
    """Step k of the unroll at base row t computes what the inference head computes drafting
    position t + k: extend rows 0..t, then k steps fed the previous step's hidden (with the
    true tokens, as in training)."""
    head, trainable = _pair(tiny)
    ids = repetitive_prompts(tiny)[0][:16]
    feats = _features(tiny, ids)
    t, steps = 6, 3
    kv = head.new_kv()
    out = head.forward(torch.tensor(ids[1:t + 2]), feats[:t + 1], torch.arange(t + 1), [kv],
                       [t + 1])
    expected = [out.logits[-1]]
    hidden = out.hidden[-1:]
    for k in range(1, steps):
        out = head.forward(torch.tensor([ids[t + 1 + k]]), hidden, torch.tensor([t + k]), [kv],
                           [1])
        expected.append(out.logits[0])
        hidden = out.hidden
    for k, hidden in trainable.unroll(torch.tensor(ids), feats, 2, steps):
        torch.testing.assert_close(trainable.logits(hidden[t - 2]), expected[k], atol=1e-5,
                                   rtol=1e-5, msg=f"step {k}")


def test_train_draft_writes_a_head_that_drafts(tiny: LoadedModel, tmp_path: Path) -> None:
    """Two steps, then `resume` with one more epoch: the head in OUT loads, fits the tiny
    target's layers, and drafts with greedy output unchanged."""
    out = tmp_path / "head"
    options = TrainOptions(out=out, num_samples=3, max_new_tokens=12, epochs=1,
                           ttt_length=3, draft_vocab=256, capture_layers=LAYERS, save_every=2)
    train_draft(tiny, options)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    head = load_eagle3_head(out, target_config=tiny.model.config,
                            target_embed=tiny.model.weights.embed, dtype=torch.float32)
    assert head.config.captured_layer_ids == LAYERS
    resumed = train_draft(tiny, TrainOptions(**{**options.__dict__, "resume": True,
                                                "epochs": 2}))
    assert resumed.draft_ids.numel() == 256
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompts = repetitive_prompts(tiny)[:2]
    plain = run(make_engine(tiny, "none"), prompts, params)
    spec = run(make_engine(tiny, f"eagle3:{out}"), prompts, params)
    for rid, done in plain.items():
        assert spec[rid].output_token_ids == done.output_token_ids, rid


def test_draft_vocabulary_and_prompts() -> None:
    samples = [Sample((5, 9, 9, 9, 7, 7, 3), 2), Sample((1, 3, 3), 1)]
    assert draft_vocabulary(samples, 20, 3).tolist() == [3, 7, 9]
    assert draft_vocabulary(samples, 20, 5).tolist() == [0, 1, 3, 7, 9]
    with pytest.raises(ValueError):
        draft_vocabulary(samples, 20, 21)
    prompts = training_prompts(50, seed=1)
    assert prompts == training_prompts(50, seed=1)
    assert len({str(p) for p in prompts}) > 40


def test_capture_sample_shapes(tiny: LoadedModel) -> None:
    ids = repetitive_prompts(tiny)[2]
    cap = capture_sample(tiny, Sample(tuple(ids), 3), LAYERS)
    assert cap.features.shape == (len(ids), 2 * tiny.model.config.hidden_size)
    assert cap.argmax.shape == (len(ids),)
