"""EAGLE-3 heads in the public format: round trips through both file formats, the captured
layers each layout names, every refusal with its message, and the forward against a
straightforward per-position reference written here (fp32 and bf16), including an extend, draft
steps, a rollback and a re-extend that must equal recomputing from scratch."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.errors import InvalidDraftHead
from engine.spec.eagle3_checkpoint import (
    Eagle3Checkpoint,
    random_eagle3_head,
    read_eagle3_checkpoint,
    save_eagle3_head,
)
from engine.spec.eagle3_head import Eagle3Head, HeadKV, load_eagle3_head

TARGET = ModelConfig(architecture="llama", num_layers=8, hidden_size=64, intermediate_size=96,
                     num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=300,
                     rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=512,
                     tie_word_embeddings=False)
DRAFT_VOCAB = 40
FUSED = 3 * TARGET.hidden_size
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}  # (atol, rtol)
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def target_embed() -> torch.Tensor:
    return torch.randn(TARGET.vocab_size, TARGET.hidden_size,
                       generator=torch.Generator().manual_seed(7)) * 0.5


def write_head(folder: Path, checkpoint: Eagle3Checkpoint | None = None, *,
               file_format: Literal["safetensors", "bin"] = "safetensors",
               name_prefix: str = "") -> Path:
    save_eagle3_head(folder, checkpoint or random_eagle3_head(TARGET, DRAFT_VOCAB, seed=0),
                     file_format=file_format, name_prefix=name_prefix)
    return folder


def load(folder: Path, dtype: torch.dtype = torch.float32,
         embed: torch.Tensor | None = None) -> Eagle3Head:
    return load_eagle3_head(folder, target_config=TARGET,
                            target_embed=target_embed() if embed is None else embed, dtype=dtype)


def edit_config(folder: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    raw = json.loads((folder / "config.json").read_text())
    edit(raw)
    (folder / "config.json").write_text(json.dumps(raw))


def edit_tensors(folder: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


# ---- the reference: one row at a time, fp32, straight from the tensors ------------------------

def ref_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean() + eps) * weight


def ref_rope(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """x: (heads, head_dim); pairs (i, i + half) rotate by position * theta^(-2i/head_dim)."""
    half = x.shape[-1] // 2
    out = x.clone()
    for i in range(half):
        angle = position * theta ** (-2 * i / x.shape[-1])
        c, s = math.cos(angle), math.sin(angle)
        out[:, i] = x[:, i] * c - x[:, i + half] * s
        out[:, i + half] = x[:, i + half] * c + x[:, i] * s
    return out


def reference(checkpoint: Eagle3Checkpoint, embed: torch.Tensor, dtype: torch.dtype,
              rows: list[tuple[int, torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft logits (n, draft_vocab) and pre-norm outputs (n, H) of one sequence's rows
    (token id, hidden input, position), each attending to itself and every earlier row.
    Weights are rounded to `dtype` first, as the head holds them, then used in fp32."""
    cfg = checkpoint.config
    t = {name: w.to(dtype).float() for name, w in checkpoint.tensors.items() if name != "d2t"}
    lm_head = (embed if cfg.tie_word_embeddings else t["lm_head.weight"]).to(dtype).float()
    embed = embed.to(dtype).float()
    eps, hd = cfg.rms_norm_eps, cfg.head_dim
    group = cfg.num_heads // cfg.num_kv_heads
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits, outs = [], []
    for token, hidden, position in rows:
        hidden = hidden.to(dtype).float()
        h = t["fc.weight"] @ hidden if hidden.numel() == cfg.fused_size else hidden
        normed_h = ref_norm(h, t["midlayer.hidden_norm.weight"], eps)
        residual = normed_h if cfg.norm_before_residual else h
        x = torch.cat([ref_norm(embed[token], t["midlayer.input_layernorm.weight"], eps),
                       normed_h])
        q = ref_rope((t["midlayer.self_attn.q_proj.weight"] @ x).view(cfg.num_heads, hd),
                     position, cfg.rope.theta)
        keys.append(ref_rope((t["midlayer.self_attn.k_proj.weight"] @ x)
                             .view(cfg.num_kv_heads, hd), position, cfg.rope.theta))
        values.append((t["midlayer.self_attn.v_proj.weight"] @ x).view(cfg.num_kv_heads, hd))
        heads = []
        for head in range(cfg.num_heads):
            scores = torch.stack([q[head] @ k[head // group] for k in keys]) / math.sqrt(hd)
            probs = torch.softmax(scores, dim=0)
            heads.append(sum(p * v[head // group] for p, v in zip(probs, values, strict=True)))
        residual = residual + t["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
        m = ref_norm(residual, t["midlayer.post_attention_layernorm.weight"], eps)
        gate, up = t["midlayer.mlp.gate_proj.weight"] @ m, t["midlayer.mlp.up_proj.weight"] @ m
        out = residual + t["midlayer.mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * up)
        logits.append(lm_head @ ref_norm(out, t["norm.weight"], eps))
        outs.append(out)
    return torch.stack(logits), torch.stack(outs)


def features(num_rows: int, seed: int) -> torch.Tensor:
    return torch.randn(num_rows, FUSED, generator=torch.Generator().manual_seed(seed))


def tokens(num_rows: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TARGET.vocab_size, (num_rows,),
                         generator=torch.Generator().manual_seed(seed))


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{what} ({dtype}): {m}")


# ---- loading ---------------------------------------------------------------------------------

@pytest.mark.parametrize("file_format", ["safetensors", "bin"])
@pytest.mark.parametrize("name_prefix", ["", "model."])
@pytest.mark.parametrize("with_embed", [False, True])
def test_round_trip(tmp_path: Path, file_format: Literal["safetensors", "bin"],
                    name_prefix: str, with_embed: bool) -> None:
    original = random_eagle3_head(TARGET, DRAFT_VOCAB, seed=3, with_embed=with_embed)
    write_head(tmp_path, original, file_format=file_format, name_prefix=name_prefix)
    assert (tmp_path / ("model.safetensors" if file_format == "safetensors"
                        else "pytorch_model.bin")).is_file()
    read = read_eagle3_checkpoint(tmp_path, target_config=TARGET)
    assert read.config == original.config
    assert read.tensors.keys() == original.tensors.keys()
    for name, tensor in original.tensors.items():
        assert torch.equal(read.tensors[name], tensor), name
    embed = target_embed()
    head = load(tmp_path, embed=embed)
    if with_embed:
        assert torch.equal(head.embed, original.tensors["embed_tokens.weight"])
    else:
        assert head.embed is embed  # the target's, by reference
    assert torch.equal(head.draft_to_target,
                       torch.arange(DRAFT_VOCAB) + original.tensors["d2t"])


def test_vllm_layer_names_and_ignored_t2d(tmp_path: Path) -> None:
    original = random_eagle3_head(TARGET, DRAFT_VOCAB, seed=3)
    write_head(tmp_path, original)

    def rename(tensors: dict[str, torch.Tensor]) -> None:
        for name in [n for n in tensors if n.startswith("midlayer.")]:
            tensors["layers.0." + name.removeprefix("midlayer.")] = tensors.pop(name)
        tensors["t2d"] = torch.zeros(TARGET.vocab_size, dtype=torch.bool)

    edit_tensors(tmp_path, rename)
    read = read_eagle3_checkpoint(tmp_path, target_config=TARGET)
    assert sorted(read.tensors) == sorted(original.tensors)


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda raw: None, (2, 4, 5)),  # the default (2, L//2, L-3) for L = 8
    # SGLang's layout counts layer outputs: output of layer k = the stream entering k + 1.
    (lambda raw: raw["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 6]),
     (2, 4, 7)),
    (lambda raw: raw["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[6, 0, 3]),
     (1, 4, 7)),
    # vLLM's top-level field is used as is.
    (lambda raw: raw.update(eagle_aux_hidden_state_layer_ids=[0, 3, 7]), (0, 3, 7)),
])
def test_captured_layers(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                         expected: tuple[int, ...]) -> None:
    write_head(tmp_path)

    def apply(raw: dict[str, Any]) -> None:
        del raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        edit(raw)

    edit_config(tmp_path, apply)
    assert load(tmp_path).config.captured_layer_ids == expected


def test_speculators_layout(tmp_path: Path) -> None:
    """vLLM's speculators config: layer fields nested, ids as is, norm_before_residual on."""
    checkpoint = random_eagle3_head(TARGET, DRAFT_VOCAB, seed=5)
    write_head(tmp_path, checkpoint)

    def to_speculators(raw: dict[str, Any]) -> None:
        layer = {k: raw.pop(k) for k in list(raw) if k not in ("draft_vocab_size",
                                                               "target_hidden_size")}
        layer.pop("eagle_config")
        layer["architectures"] = ["LlamaForCausalLM"]
        raw.update(architectures=["Eagle3Speculator"], speculators_model_type="eagle3",
                   transformer_layer_config=layer, eagle_aux_hidden_state_layer_ids=[1, 4, 6])

    edit_config(tmp_path, to_speculators)
    head = load(tmp_path)
    assert head.config.norm_before_residual
    assert head.config.captured_layer_ids == (1, 4, 6)
    hidden, token_ids = features(4, seed=1), tokens(4, seed=1)
    out = head.forward(token_ids, hidden, torch.arange(4), [head.new_kv()], [4])
    expected = reference(replace(checkpoint, config=head.config), head.embed, torch.float32,
                         [(int(token_ids[i]), hidden[i], i) for i in range(4)])
    close(out.logits, expected[0], torch.float32, "logits")
    close(out.hidden, expected[1], torch.float32, "hidden")


def _remove(folder: Path, name: str) -> None:
    (folder / name).unlink()


def _damage(folder: Path, name: str) -> None:
    (folder / name).write_bytes(b"not a checkpoint")


REFUSALS: list[tuple[str, Callable[[Path], None], str]] = [
    ("fc shape", lambda f: edit_tensors(f, lambda t: t.update(
        {"fc.weight": torch.zeros(64, 128)})),
     r"fc.weight has shape \(64, 128\), expected \(64, 192\) = \(hidden_size, 3 captured"),
    ("wrong vocab", lambda f: edit_config(f, lambda r: r.update(vocab_size=301)),
     r"vocab_size is 301, the target's vocabulary has 300 tokens"),
    ("target hidden", lambda f: edit_config(f, lambda r: r.update(target_hidden_size=32)),
     r"target_hidden_size is 32, the target's hidden size is 64"),
    ("unknown architecture", lambda f: edit_config(
        f, lambda r: r.update(architectures=["LlamaForCausalLM"])),
     r"architectures \['LlamaForCausalLM'\] names no EAGLE-3 head"),
    ("no folder", shutil.rmtree, r"folder .* does not exist"),
    ("no config", lambda f: _remove(f, "config.json"), r"has no config.json"),
    ("no weights", lambda f: _remove(f, "model.safetensors"),
     r"has no model.safetensors or pytorch_model.bin"),
    ("damaged weights", lambda f: _damage(f, "model.safetensors"),
     r"model.safetensors is damaged or not a checkpoint"),
    ("damaged config", lambda f: _damage(f, "config.json"), r"config.json is not readable JSON"),
    ("d2t out of range", lambda f: edit_tensors(f, lambda t: t["d2t"].add_(1000)),
     r"d2t maps 40 draft id\(s\) outside the target's vocabulary 0..299"),
    ("d2t duplicate", lambda f: edit_tensors(f, lambda t: t["d2t"].copy_(-torch.arange(40))),
     r"d2t maps two draft ids to the same target token"),
    ("missing tensor", lambda f: edit_tensors(f, lambda t: t.pop("norm.weight")),
     r"lacks tensors \['norm.weight'\]"),
    ("unknown tensor", lambda f: edit_tensors(f, lambda t: t.update(
        {"midlayer.self_attn.q_proj.bias": torch.zeros(64)})),
     r"does not have: \['midlayer.self_attn.q_proj.bias'\]"),
    ("float d2t", lambda f: edit_tensors(f, lambda t: t.update(d2t=t["d2t"].float())),
     r"d2t has dtype torch.float32, expected an integer dtype"),
    ("layer outside", lambda f: edit_config(f, lambda r: r["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[1, 3, 8])),
     r"captures the stream entering layer\(s\) \[9\], outside the target's 0..7"),
    ("two layers", lambda f: edit_config(f, lambda r: r.update(num_hidden_layers=2)),
     r"num_hidden_layers=2, which radixgate does not implement"),
    ("rope scaling", lambda f: edit_config(f, lambda r: r.update(
        rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
     r"rope_type 'dynamic' is not implemented"),
    ("missing field", lambda f: edit_config(f, lambda r: r.pop("hidden_size")),
     r"lacks 'hidden_size'"),
    ("field type", lambda f: edit_config(f, lambda r: r.update(hidden_size="wide")),
     r"config.json: a field has the wrong type"),
    ("speculators norm_before_fc", lambda f: edit_config(f, lambda r: r.update(
        architectures=["Eagle3Speculator"], transformer_layer_config=dict(r),
        norm_before_fc=True)),
     r"norm_before_fc=true, which radixgate does not implement"),
]


@pytest.mark.parametrize(("break_head", "message"), [(b, m) for _, b, m in REFUSALS],
                         ids=[name for name, _, _ in REFUSALS])
def test_refusals(tmp_path: Path, break_head: Callable[[Path], None], message: str) -> None:
    folder = write_head(tmp_path / "head")
    break_head(folder)
    with pytest.raises(InvalidDraftHead, match=message):
        load(folder)


def test_refuses_a_target_embedding_of_the_wrong_width(tmp_path: Path) -> None:
    write_head(tmp_path)
    with pytest.raises(InvalidDraftHead, match=r"has no embed_tokens.weight, so the head reads "
                       r"the target's embedding, which is \(300, 32\); the head needs \(300, 64\)"):
        load(tmp_path, embed=torch.zeros(300, 32))


# ---- the forward -----------------------------------------------------------------------------

@DTYPES
def test_batched_extend_matches_reference(tmp_path: Path, dtype: torch.dtype) -> None:
    """Two sequences in one call, one with rows already cached, against the reference."""
    checkpoint = random_eagle3_head(TARGET, DRAFT_VOCAB, seed=1)
    head = load(write_head(tmp_path, checkpoint), dtype)
    hidden = [features(7, seed=10), features(3, seed=11)]
    token_ids = [tokens(7, seed=10), tokens(3, seed=11)]
    kvs = [head.new_kv(), head.new_kv()]
    head.forward(token_ids[0][:4], hidden[0][:4], torch.arange(4), kvs[:1], [4])  # cached rows
    out = head.forward(torch.cat([token_ids[0][4:], token_ids[1]]),
                       torch.cat([hidden[0][4:], hidden[1]]),
                       torch.cat([torch.arange(4, 7), torch.arange(3)]), kvs, [3, 3])
    for kv, num_rows in zip(kvs, (7, 3), strict=True):
        kv.check_invariants()
        assert kv.num_tokens == num_rows
    for seq, rows in ((0, slice(0, 3)), (1, slice(3, 6))):
        n = len(token_ids[seq])
        logits, outs = reference(checkpoint, head.embed, dtype,
                                 [(int(token_ids[seq][i]), hidden[seq][i], i) for i in range(n)])
        close(out.logits[rows], logits[-3:], dtype, f"sequence {seq} logits")
        close(out.hidden[rows], outs[-3:], dtype, f"sequence {seq} hidden")
    assert out.logits.dtype == torch.float32 and out.hidden.dtype == dtype


@DTYPES
def test_draft_steps_rollback_and_reextend_equal_recompute(tmp_path: Path,
                                                           dtype: torch.dtype) -> None:
    """Extend 6 rows, draft 3 steps on the head's own hidden, roll back, extend the 2
    accepted rows: the same as extending all 8 rows at once, and as the reference."""
    checkpoint = random_eagle3_head(TARGET, DRAFT_VOCAB, seed=2)
    head = load(write_head(tmp_path, checkpoint), dtype)
    hidden, token_ids = features(8, seed=20), tokens(8, seed=20)
    kv = head.new_kv()
    out = head.forward(token_ids[:6], hidden[:6], torch.arange(6), [kv], [6])
    rows = [(int(token_ids[i]), hidden[i], i) for i in range(6)]
    for step in range(3):
        token = head.top_k(out.logits[-1:], 1).token_ids[0]
        step_hidden = out.hidden[-1:]
        out = head.forward(token, step_hidden, torch.tensor([6 + step]), [kv], [1])
        rows.append((int(token), step_hidden[0], 6 + step))
        logits, outs = reference(checkpoint, head.embed, dtype, rows)
        close(out.logits[0], logits[-1], dtype, f"draft step {step} logits")
        close(out.hidden[0], outs[-1], dtype, f"draft step {step} hidden")
    assert kv.num_tokens == 9
    kv.truncate(6)
    kv.check_invariants()
    resumed = head.forward(token_ids[6:], hidden[6:], torch.arange(6, 8), [kv], [2])
    fresh_kv = head.new_kv()
    fresh = head.forward(token_ids, hidden, torch.arange(8), [fresh_kv], [8])
    torch.testing.assert_close(resumed.logits, fresh.logits[6:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv.k, fresh_kv.k)
    assert torch.equal(kv.positions, torch.arange(8))
    logits, outs = reference(checkpoint, head.embed, dtype,
                             [(int(token_ids[i]), hidden[i], i) for i in range(8)])
    close(resumed.logits, logits[6:], dtype, "re-extended logits")
    close(resumed.hidden, outs[6:], dtype, "re-extended hidden")


def test_top_k_maps_draft_ids_to_target_ids(tmp_path: Path) -> None:
    checkpoint = random_eagle3_head(TARGET, DRAFT_VOCAB, seed=4)
    head = load(write_head(tmp_path, checkpoint))
    out = head.forward(tokens(3, seed=1), features(3, seed=1), torch.arange(3),
                       [head.new_kv()], [3])
    top = head.top_k(out.logits, 5)
    draft_ids = out.logits.argsort(dim=-1, descending=True)[:, :5]
    assert torch.equal(top.token_ids, draft_ids + checkpoint.tensors["d2t"][draft_ids])
    torch.testing.assert_close(top.logprobs, torch.log_softmax(out.logits, -1).gather(
        1, draft_ids))
    assert bool((top.logprobs[:, :-1] >= top.logprobs[:, 1:]).all())


def test_tied_head_reads_logits_off_the_embedding(tmp_path: Path) -> None:
    base = random_eagle3_head(TARGET, TARGET.vocab_size, seed=6, with_embed=True)
    tensors = {k: v for k, v in base.tensors.items() if k not in ("lm_head.weight", "d2t")}
    checkpoint = Eagle3Checkpoint(replace(base.config, tie_word_embeddings=True), tensors)
    head = load(write_head(tmp_path, checkpoint))
    hidden, token_ids = features(3, seed=2), tokens(3, seed=2)
    out = head.forward(token_ids, hidden, torch.arange(3), [head.new_kv()], [3])
    logits, _ = reference(checkpoint, tensors["embed_tokens.weight"], torch.float32,
                          [(int(token_ids[i]), hidden[i], i) for i in range(3)])
    close(out.logits, logits, torch.float32, "tied logits")
    assert torch.equal(head.top_k(out.logits, 1).token_ids[:, 0], out.logits.argmax(-1))


def test_head_kv_truncate_bounds() -> None:
    kv = HeadKV(2, 16, torch.float32)
    kv.extend(torch.zeros(3, 2, 16), torch.ones(3, 2, 16), torch.arange(3))
    with pytest.raises(ValueError, match=r"truncate\(4\) with 3 rows held"):
        kv.truncate(4)
    with pytest.raises(ValueError, match="do not match"):
        kv.extend(torch.zeros(1, 2, 16), torch.zeros(1, 2, 16), torch.arange(2))
    kv.truncate(0)
    kv.check_invariants()
    assert kv.num_tokens == 0
