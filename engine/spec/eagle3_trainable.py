"""A trainable EAGLE-3 head: `Eagle3Head`'s math as a torch `nn.Module`, with the training-time
test (TTT) unroll of EAGLE-3 / SpecForge (eagle3.md §3).

One sequence x_0 .. x_{T-1} with captured features f_t, the target's logits z_t (predicting
x_{t+1}) and a loss mask m_j (x_j is a response token). Base row t = 0 .. T-2:

    step 0   token x_{t+1}, hidden fc(f_t), position t            -> z_{t+1}, weighted m_{t+2}
    step k   token x_{t+1+k}, hidden = step k-1's output at row t,
             position t + k                                       -> z_{t+1+k}, weighted m_{t+2+k}

Attention at step k >= 1: row t sees step 0's keys at rows <= t (causal) and the keys of steps
1..k at row t only (the diagonal); this is what the chain drafter sees at inference, where
step k drafts position t + k. Positions are the inference ones (t + k; SpecForge keeps t); the
relative distances then match `Eagle3Drafter`'s. Loss: soft cross-entropy against the target's
softmax over the draft vocabulary, on rows masked by m × (target argmax in the draft
vocabulary), mean over rows, total Σ 0.8^k loss_k. Everything runs in fp32; the embedding is
frozen (the target's, a buffer).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.ops import apply_rotary, rms_norm
from engine.models.rope import inverse_frequencies
from engine.spec.eagle3_checkpoint import D2T, EMBED, LM_HEAD, expected_shapes
from engine.spec.eagle3_config import Eagle3Config

STEP_WEIGHT = 0.8


class TTTResult(NamedTuple):
    loss: torch.Tensor  # () fp32, Σ 0.8^k loss_k, differentiable
    step_losses: list[float]  # loss_k per step (0.0 where a step has no masked row)
    step_correct: list[int]  # rows whose draft top-1 is the target's argmax, per step
    step_rows: list[int]  # masked rows per step


class TrainableEagle3Head(nn.Module):
    """Parameters under the public tensor names ('.' -> '__' for torch), fp32. `embed`
    (vocab, H) is the frozen target embedding; `draft_ids` (draft_vocab,) the target id of
    each draft id (ascending)."""

    embed: torch.Tensor
    draft_ids: torch.Tensor
    inv_freq: torch.Tensor

    def __init__(self, config: Eagle3Config, tensors: Mapping[str, torch.Tensor],
                 embed: torch.Tensor, draft_ids: torch.Tensor) -> None:
        super().__init__()
        if config.tie_word_embeddings:
            raise ValueError("a trainable head needs its own lm_head (tie_word_embeddings off)")
        self.config = config
        self.names = [n for n in expected_shapes(config) if n not in (D2T, EMBED)]
        for name in self.names:
            self.register_parameter(name.replace(".", "__"),
                                    nn.Parameter(tensors[name].detach().float().clone()))
        # A copy: the target's may be an inference tensor, which autograd cannot save.
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)
        self.register_buffer("draft_ids", draft_ids.to(torch.int64), persistent=False)
        inv_freq, factor = inverse_frequencies(config.rope, config.head_dim)
        self.register_buffer("inv_freq", inv_freq.to(torch.float64), persistent=False)
        self.rope_factor = factor

    def w(self, name: str) -> torch.Tensor:
        param: torch.Tensor = getattr(self, name.replace(".", "__"))
        return param

    def public_tensors(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The head's tensors under their public names in `dtype` (d2t int64), detached."""
        out = {name: self.w(name).detach().to(dtype) for name in self.names}
        out[D2T] = self.draft_ids - torch.arange(self.draft_ids.numel())
        return out

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 0 over one sequence: (logits (T, draft_vocab), hidden output (T, H)), equal
        to `Eagle3Head.forward` extending a fresh KV with the same rows."""
        residual, q, k, v = self._qkv(token_ids, self._fuse(features), positions)
        out = self._finish(residual, self._attend(q, k, v, []))
        return self.logits(out), out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        return rms_norm(out, self.w("norm.weight"), cfg.rms_norm_eps) @ self.w(LM_HEAD).T

    def unroll(self, token_ids: torch.Tensor, features: torch.Tensor, first: int,
               ttt_length: int) -> Iterator[tuple[int, torch.Tensor]]:
        """The TTT unroll of one sequence (module docstring): yields (step k, the pre-norm
        outputs (rows, H) of base rows first .. T-2-k), steps while rows remain. Rows before
        `first` are computed at step 0 only (as keys). `token_ids` (T,); `features` (T, fused)."""
        n = token_ids.numel() - 1  # base rows
        residual, q, k0, v0 = self._qkv(token_ids[1:], self._fuse(features[:n]), torch.arange(n))
        diag: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden = self._finish(residual, self._attend(q, k0, v0, diag))[first:]
        for step in range(ttt_length):
            num_rows = n - step  # rows t with a token x_{t+1+step}
            if num_rows <= first:
                return
            if step:
                base = torch.arange(first, num_rows)
                residual, q, k, v = self._qkv(token_ids[base + 1 + step],
                                              hidden[: num_rows - first], base + step)
                diag.append((k, v))
                hidden = self._finish(residual, self._attend(q, k0, v0, diag, first=first))
            yield step, hidden

    def ttt_loss(self, token_ids: torch.Tensor, features: torch.Tensor,
                 target_logits: torch.Tensor, target_argmax: torch.Tensor,
                 response_start: int, ttt_length: int) -> TTTResult:
        """The TTT loss of one sequence (module docstring). `token_ids` (T,) int64;
        `features` (T, fused); `target_logits` (T, draft_vocab) fp32, the target's logits
        restricted to the draft vocabulary; `target_argmax` (T,) the target's greedy token."""
        num_tokens = token_ids.numel()
        in_draft = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        in_draft[self.draft_ids] = True
        # Rows that never reach a response token are only needed as step 0's keys.
        first = max(0, response_start - 2 - (ttt_length - 1))
        total = torch.zeros(())
        result = TTTResult(total, [], [], [])
        for step, hidden in self.unroll(token_ids, features, first, ttt_length):
            base = torch.arange(first, first + hidden.shape[0])
            target_rows = base + 1 + step
            predicted = base + 2 + step  # the token each row's logits predict
            mask = (predicted < num_tokens) & (predicted >= response_start)
            mask &= in_draft[target_argmax[target_rows]]
            picked = mask.nonzero().flatten()
            if picked.numel() == 0:
                result.step_losses.append(0.0)
                result.step_correct.append(0)
                result.step_rows.append(0)
                continue
            logp = torch.log_softmax(self.logits(hidden[picked]), -1)
            target_p = torch.softmax(target_logits[target_rows[picked]].float(), -1)
            loss = -(target_p * logp).sum(-1).mean()
            total = total + STEP_WEIGHT ** step * loss
            correct = self.draft_ids[logp.argmax(-1)] == target_argmax[target_rows[picked]]
            result.step_losses.append(float(loss.detach()))
            result.step_correct.append(int(correct.sum()))
            result.step_rows.append(int(picked.numel()))
        return result._replace(loss=total)

    def _fuse(self, features: torch.Tensor) -> torch.Tensor:
        return features.float() @ self.w("fc.weight").T

    def _qkv(self, token_ids: torch.Tensor, h: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(residual, q (N, heads, hd), k, v (N, kv_heads, hd)), q and k rotated."""
        cfg = self.config
        eps = cfg.rms_norm_eps
        normed_h = rms_norm(h, self.w("midlayer.hidden_norm.weight"), eps)
        residual = normed_h if cfg.norm_before_residual else h
        emb = rms_norm(self.embed[token_ids], self.w("midlayer.input_layernorm.weight"), eps)
        x = torch.cat([emb, normed_h], -1)
        attn = "midlayer.self_attn."
        hd = cfg.head_dim
        q = self._rotate((x @ self.w(attn + "q_proj.weight").T).view(-1, cfg.num_heads, hd),
                         positions)
        k = self._rotate((x @ self.w(attn + "k_proj.weight").T).view(-1, cfg.num_kv_heads, hd),
                         positions)
        v = (x @ self.w(attn + "v_proj.weight").T).view(-1, cfg.num_kv_heads, hd)
        return residual, q, k, v

    def _attend(self, q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                diag: list[tuple[torch.Tensor, torch.Tensor]], first: int = 0) -> torch.Tensor:
        """(rows, q_size): query row i (base row first + i) over step 0's keys at rows
        <= first + i and, per later step, that step's key at the same row. `diag` tensors
        start at row `first`."""
        cfg = self.config
        group = cfg.num_heads // cfg.num_kv_heads
        num_rows = q.shape[0]
        scale = cfg.head_dim ** -0.5
        keys = k0.repeat_interleave(group, 1).transpose(0, 1)  # (heads, n, hd)
        values = v0.repeat_interleave(group, 1).transpose(0, 1)
        qh = q.transpose(0, 1)  # (heads, rows, hd)
        scores = qh @ keys.transpose(1, 2) * scale  # (heads, rows, n)
        base = torch.arange(first, first + num_rows)
        causal = torch.arange(k0.shape[0])[None, :] <= base[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
        extra = [(qh * k[:num_rows].repeat_interleave(group, 1).transpose(0, 1)).sum(-1)
                 * scale for k, _ in diag]  # (heads, rows) each
        probs = torch.softmax(torch.cat([scores, *(e[..., None] for e in extra)], -1), -1)
        out = probs[..., : k0.shape[0]] @ values
        for j, (_, v) in enumerate(diag):
            vh = v[:num_rows].repeat_interleave(group, 1).transpose(0, 1)
            out = out + probs[..., k0.shape[0] + j, None] * vh
        return out.transpose(0, 1).reshape(num_rows, cfg.q_size)

    def _finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer after attention: o_proj, residual add, MLP, residual add (pre-norm out)."""
        w, eps = self.w, self.config.rms_norm_eps
        residual = residual + attn @ w("midlayer.self_attn.o_proj.weight").T
        m = rms_norm(residual, w("midlayer.post_attention_layernorm.weight"), eps)
        gate = m @ w("midlayer.mlp.gate_proj.weight").T
        up = m @ w("midlayer.mlp.up_proj.weight").T
        return residual + (F.silu(gate) * up) @ w("midlayer.mlp.down_proj.weight").T

    def _rotate(self, heads: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary as `Eagle3Head._rotate` computes it (angles in fp64)."""
        angles = torch.outer(positions.to(torch.float64), self.inv_freq)
        emb = torch.cat([angles, angles], dim=-1)
        cos = (emb.cos() * self.rope_factor).float()[:, None, :]
        sin = (emb.sin() * self.rope_factor).float()[:, None, :]
        return apply_rotary(heads.float(), cos, sin)
