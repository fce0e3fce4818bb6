"""An EAGLE-3 draft head: one Llama layer over the target's captured features, with its own KV.

The forward follows SGLang's and vLLM's `llama_eagle3` (eagle3.md §1): `fc` fuses the captured
layers (only when the hidden input is the fused width), the layer attends over
`cat(input_layernorm(embed(token)), hidden_norm(h))`, and the logits are over the draft
vocabulary, whose ids map to the target's through `d2t`. The pre-norm output is the next draft
step's hidden input.

Correctness over speed: plain torch ops, one attention call per sequence
(`F.scaled_dot_product_attention` in fp32 with an explicit mask), and a per-sequence `HeadKV`
that concatenates on every extend. Norms, rotary and attention compute in fp32; projections
run in the head's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.errors import InvalidDraftHead
from engine.models.ggml_weight import Table, dense_table, embedding
from engine.models.ops import apply_rotary, rms_norm
from engine.models.rope import inverse_frequencies
from engine.spec.eagle3_checkpoint import D2T, EMBED, LM_HEAD, read_eagle3_checkpoint
from engine.spec.eagle3_config import Eagle3Config


class HeadKV:
    """One sequence's keys and values in the head's single layer. Mutable; owned by whoever
    drafts for the sequence. `k`, `v`: (num_tokens, num_kv_heads, head_dim) in the head's dtype,
    keys after rotary; `positions`: (num_tokens,) int64, the position each row was computed at.
    Row order is the order rows were extended in, which the forward's causal mask follows.

    Rows live in buffers that grow by doubling, so a draft step appends in place instead of
    copying the whole cache (the views `k`, `v`, `positions` are valid until the next
    `extend`)."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self._k = torch.empty(0, num_kv_heads, head_dim, dtype=dtype, device=device)
        self._v = torch.empty_like(self._k)
        self._positions = torch.empty(0, dtype=torch.int64, device=device)
        self._num_tokens = 0

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def k(self) -> torch.Tensor:
        return self._k[: self._num_tokens]

    @property
    def v(self) -> torch.Tensor:
        return self._v[: self._num_tokens]

    @property
    def positions(self) -> torch.Tensor:
        return self._positions[: self._num_tokens]

    def extend(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Append rows: `k`, `v` (n, num_kv_heads, head_dim), `positions` (n,)."""
        if not k.shape == v.shape == (positions.numel(), *self._k.shape[1:]):
            raise ValueError(f"HeadKV.extend: k {tuple(k.shape)}, v {tuple(v.shape)} and "
                             f"{positions.numel()} positions do not match {self._k.shape[1:]}")
        start, end = self._num_tokens, self._num_tokens + positions.numel()
        if end > self._k.shape[0]:
            capacity = max(end, 2 * self._k.shape[0], 64)
            for name in ("_k", "_v", "_positions"):
                old = getattr(self, name)
                grown = old.new_empty((capacity, *old.shape[1:]))
                grown[:start] = old[:start]
                setattr(self, name, grown)
        self._k[start:end] = k
        self._v[start:end] = v
        self._positions[start:end] = positions
        self._num_tokens = end

    def truncate(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` rows (rollback of rejected drafts). Raises ValueError
        when `num_tokens` is negative or more than held."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"HeadKV.truncate({num_tokens}) with {self._num_tokens} rows held")
        self._num_tokens = num_tokens

    def check_invariants(self) -> None:
        n = self._num_tokens
        assert 0 <= n <= self._k.shape[0] == self._v.shape[0] == self._positions.shape[0], (
            f"HeadKV: {n} rows in buffers of {self._k.shape[0]}, {self._v.shape[0]}, "
            f"{self._positions.shape[0]}")
        assert self._k.shape == self._v.shape, f"HeadKV: k {self._k.shape} vs v {self._v.shape}"


class HeadOutput(NamedTuple):
    logits: torch.Tensor  # (N, draft_vocab_size) fp32, over the draft vocabulary
    hidden: torch.Tensor  # (N, hidden_size) head dtype: pre-norm output, the next step's input


class TopK(NamedTuple):
    token_ids: torch.Tensor  # (N, k) int64, target token ids, best first
    logprobs: torch.Tensor  # (N, k) fp32, log-softmax over the draft vocabulary


class Eagle3Head:
    """A loaded head in `dtype` on the CPU. Holds no per-sequence state: that is in `HeadKV`.
    `embed`: (vocab_size, hidden_size), the head's own embedding or the target's (kept by
    reference, rows cast on lookup, so no copy of a large vocabulary is made)."""

    def __init__(self, config: Eagle3Config, tensors: Mapping[str, torch.Tensor],
                 embed: Table, dtype: torch.dtype) -> None:
        self.config = config
        self.dtype = dtype
        self.weights = {name: t.to(dtype) for name, t in tensors.items()
                        if name not in (D2T, EMBED, LM_HEAD)}
        self.embed = embed
        # Tied heads read their logits off the (full-vocabulary) embedding, as SGLang does.
        self.lm_head = (dense_table(embed) if config.tie_word_embeddings
                        else tensors[LM_HEAD]).to(dtype)
        d2t = tensors.get(D2T)
        offsets = torch.zeros(config.draft_vocab_size, dtype=torch.int64) if d2t is None \
            else d2t.to(torch.int64)
        self.draft_to_target = torch.arange(config.draft_vocab_size) + offsets
        self._inv_freq, self._rope_factor = inverse_frequencies(config.rope, config.head_dim)

    def new_kv(self) -> HeadKV:
        return HeadKV(self.config.num_kv_heads, self.config.head_dim, self.dtype)

    def forward(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                kvs: Sequence[HeadKV], extend_lens: Sequence[int],
                masks: Sequence[torch.Tensor | None] | None = None) -> HeadOutput:
        """One pass of the layer over new rows of several sequences, packed in order: sequence
        i owns the next `extend_lens[i]` rows (several for an extend, one for a draft step).

        `token_ids` (N,) int64 target ids; `positions` (N,) int64; `hidden` (N, fused_size):
        the captured target layers concatenated (fused by `fc`), or (N, hidden_size): a
        previous step's `HeadOutput.hidden`, used as is. Each row attends to its sequence's
        cached rows and to its new rows up to itself, unless `masks[i]` (bool (extend_lens[i],
        rows held after the append)) says which rows each new row sees (tree drafts). Mutates
        `kvs`: each new row's K/V is appended. Raises ValueError when the shapes do not
        agree."""
        cfg = self.config
        num_rows = token_ids.numel()
        if sum(extend_lens) != num_rows or positions.numel() != num_rows \
                or hidden.shape[0] != num_rows or len(kvs) != len(extend_lens):
            raise ValueError(f"Eagle3Head.forward: {num_rows} tokens, {positions.numel()} "
                             f"positions, {hidden.shape[0]} hidden rows, extend_lens "
                             f"{list(extend_lens)} for {len(kvs)} sequences")
        w = self.weights
        if hidden.shape[-1] == cfg.hidden_size:
            h = hidden.to(self.dtype)
        elif hidden.shape[-1] == cfg.fused_size:
            h = hidden.to(self.dtype) @ w["fc.weight"].T
        else:
            raise ValueError(f"Eagle3Head.forward: hidden is {hidden.shape[-1]} wide; expected "
                             f"{cfg.fused_size} (fused) or {cfg.hidden_size} (recurrent)")
        eps = cfg.rms_norm_eps
        normed_h = rms_norm(h, w["midlayer.hidden_norm.weight"], eps)
        residual = normed_h if cfg.norm_before_residual else h
        emb = embedding(token_ids, self.embed).to(self.dtype)
        x = torch.cat([rms_norm(emb, w["midlayer.input_layernorm.weight"], eps), normed_h], -1)
        attn = self._attention(x, positions, kvs, extend_lens, masks)
        residual = residual + attn @ w["midlayer.self_attn.o_proj.weight"].T
        m = rms_norm(residual, w["midlayer.post_attention_layernorm.weight"], eps)
        gate = m @ w["midlayer.mlp.gate_proj.weight"].T
        up = m @ w["midlayer.mlp.up_proj.weight"].T
        out = residual + (F.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
        logits = rms_norm(out, w["norm.weight"], eps) @ self.lm_head.T
        return HeadOutput(logits.float(), out)

    def top_k(self, logits: torch.Tensor, k: int) -> TopK:
        """The k most likely tokens of each row of `logits` (N, draft_vocab_size), as target
        ids with their log-probabilities under the draft distribution. Pure."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        values, draft_ids = logprobs.topk(k, dim=-1)
        return TopK(self.draft_to_target[draft_ids], values)

    def _attention(self, x: torch.Tensor, positions: torch.Tensor, kvs: Sequence[HeadKV],
                   extend_lens: Sequence[int],
                   masks: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """(N, q_size) attention output of the rows `x` (N, 2H); appends their K/V to `kvs`."""
        cfg = self.config
        w, hd = self.weights, cfg.head_dim
        attn = "midlayer.self_attn."
        q = self._rotate((x @ w[attn + "q_proj.weight"].T).view(-1, cfg.num_heads, hd), positions)
        k = self._rotate((x @ w[attn + "k_proj.weight"].T).view(-1, cfg.num_kv_heads, hd),
                         positions)
        v = (x @ w[attn + "v_proj.weight"].T).view(-1, cfg.num_kv_heads, hd)
        group = cfg.num_heads // cfg.num_kv_heads
        outputs = []
        start = 0
        for i, (kv, num_new) in enumerate(zip(kvs, extend_lens, strict=True)):
            rows = slice(start, start + num_new)
            start += num_new
            kv.extend(k[rows], v[rows], positions[rows])
            num_past = kv.num_tokens - num_new
            given = masks[i] if masks is not None else None
            if given is not None:
                if given.shape != (num_new, kv.num_tokens):
                    raise ValueError(f"Eagle3Head.forward: mask {tuple(given.shape)} for "
                                     f"{num_new} rows over {kv.num_tokens}")
                visible = given
            else:  # row i sees every cached row and the new rows up to itself
                visible = (torch.arange(kv.num_tokens)[None, :]
                           <= num_past + torch.arange(num_new)[:, None])
            # fp32 math, grouped heads read in place (no copy of the cache per step).
            keys = kv.k.float().transpose(0, 1)
            values = kv.v.float().transpose(0, 1)
            out = F.scaled_dot_product_attention(q[rows].float().transpose(0, 1), keys, values,
                                                 attn_mask=visible, scale=hd ** -0.5,
                                                 enable_gqa=group > 1)
            outputs.append(out.transpose(0, 1).reshape(num_new, cfg.q_size))
        return torch.cat(outputs).to(self.dtype)

    def _rotate(self, heads: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary on (N, heads, head_dim); angles in fp64 as engine.models.rope takes them."""
        angles = torch.outer(positions.to(torch.float64), self._inv_freq.to(torch.float64))
        emb = torch.cat([angles, angles], dim=-1)
        cos = (emb.cos() * self._rope_factor).float()[:, None, :]
        sin = (emb.sin() * self._rope_factor).float()[:, None, :]
        return apply_rotary(heads.float(), cos, sin).to(self.dtype)


def load_eagle3_head(path: str | Path, *, target_config: ModelConfig, target_embed: Table,
                     dtype: torch.dtype) -> Eagle3Head:
    """Load the head in folder `path` (public format, eagle3_checkpoint) for the target described
    by `target_config`. `target_embed`: the target's (vocab_size, hidden) embedding, used when
    the head has none; kept by reference, never written. Raises `InvalidDraftHead` naming the
    file and field or tensor when the head is missing, damaged or does not fit the target."""
    checkpoint = read_eagle3_checkpoint(path, target_config=target_config)
    config = checkpoint.config
    embed: Table | None = checkpoint.tensors.get(EMBED)
    if embed is None:
        expected = (config.vocab_size, config.hidden_size)
        if tuple(target_embed.shape) != expected:
            raise InvalidDraftHead(
                f"{path} has no {EMBED}, so the head reads the target's embedding, which is "
                f"{tuple(target_embed.shape)}; the head needs {expected} (vocab, hidden_size)")
        embed = target_embed
    return Eagle3Head(config, checkpoint.tensors, embed, dtype)
