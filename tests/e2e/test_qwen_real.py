"""Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), the default model, served from its GGUF codes, against
transformers loading the same GGUF (it dequantises every tensor to fp32): an implementation
nobody here wrote.

- fp32 (`--dtype fp32`: the codes dequantised in registers, fp32 rows): full-vocabulary logits
  at every position of a 300-token code prompt within `MAX_ABS_LOGIT_DIFF`, and 64 greedy
  tokens through the engine identical to transformers' `generate`.
- the default dtype (int8 activation rows against the codes; bf16 KV where the CPU has bf16
  instructions), through the engine's own paged attention: top-1 agreement on >= 99% of
  positions and mean KL(fp32 || ours) <= 0.01, the check llama.cpp's `--kl-divergence` makes.

Few and marked `real_model` (several GB of memory, about a minute each): `-m "not real_model"`
leaves them out.
"""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch

from engine.attention.base import PagedBatch
from engine.attention.dense import DenseAttention
from engine.attention.registry import backend_for
from engine.engine import Engine, EngineConfig
from engine.kv_pool import KVLayout, KVPool
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

MODEL = "qwen2.5-coder-1.5b"
PROMPT_LEN = 300
GREEDY_TOKENS = 64
# Bound on |our fp32 logit - transformers' fp32 logit| over 300 positions x 151936 tokens:
# the same weights (gguf's dequantiser, bit for bit), summed in other orders.
MAX_ABS_LOGIT_DIFF = 2e-3
MIN_TOP1_AGREEMENT = 0.99
MAX_MEAN_KL = 0.01


@pytest.fixture(scope="module")
def fp32() -> LoadedModel:
    torch.set_num_threads(2)
    return load_model(MODEL, "fp32", show_progress=False)


@pytest.fixture(scope="module")
def served() -> LoadedModel:
    return load_model(MODEL, default_dtype("cpu"), show_progress=False)


@pytest.fixture(scope="module")
def hf(fp32: LoadedModel) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    path = fp32.path
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    return model


def _prompt(loaded: LoadedModel) -> list[int]:
    """A chat turn asking about real code: the template's own rendering of it, 300 tokens."""
    source = textwrap.dedent(inspect.getsource(textwrap.TextWrapper._wrap_chunks))
    messages = [{"role": "user", "content": f"Explain what this function does:\n```python\n"
                                           f"{source}```"}]
    template = loaded.tokenizer.chat_template
    assert template is not None
    ids = loaded.tokenizer.encode(template.render(messages, add_generation_prompt=True))
    assert len(ids) >= PROMPT_LEN
    return ids[:PROMPT_LEN]


@pytest.fixture(scope="module")
def hf_logits(hf: torch.nn.Module, fp32: LoadedModel) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([_prompt(fp32)])).logits[0].float()


def test_fp32_logits_match_transformers_at_every_position(
        fp32: LoadedModel, hf_logits: torch.Tensor) -> None:
    ids = torch.tensor(_prompt(fp32))
    model = fp32.model
    ours = model.logits(model.forward(ids, torch.arange(PROMPT_LEN),
                                      DenseAttention([PROMPT_LEN])))
    diff = (ours - hf_logits).abs().max().item()
    print(f"\nfp32: max |logit diff| over {PROMPT_LEN} x {ours.shape[1]}: {diff:.2e}")
    assert diff < MAX_ABS_LOGIT_DIFF


def test_fp32_greedy_matches_transformers(fp32: LoadedModel, hf: torch.nn.Module) -> None:
    ids = _prompt(fp32)
    engine = Engine(fp32, EngineConfig(kv_memory_bytes=256 << 20, check_invariants=True))
    engine.submit(Extend("g", "t", None, ids, SamplingParams(max_tokens=GREEDY_TOKENS,
                                                             ignore_eos=True)))
    (done,) = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=fp32.tokenizer.eos_token_id)
    assert done.output_token_ids == out[0, len(ids):].tolist()


def _paged_logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Logits at every position through the served path: the default attention backend over a
    KV pool in the model's KV dtype, one prefill of the whole prompt."""
    model = loaded.model
    cfg = model.config
    page_size = 16
    num_pages = -(-len(ids) // page_size)
    pool = KVPool(cfg, KVLayout(num_pages=num_pages, page_size=page_size, bytes_per_page=0),
                  model.kv_dtype)
    table = torch.arange(num_pages)
    batch = PagedBatch([len(ids)], [len(ids)], torch.arange(len(ids)), [table])
    attention = backend_for("auto", model.attention_specs)(pool, batch)
    hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)), attention)
    return model.logits(hidden)


def test_default_dtype_keeps_top1_and_kl_against_fp32(
        served: LoadedModel, hf_logits: torch.Tensor) -> None:
    ours = _paged_logits(served, _prompt(served))
    want = torch.log_softmax(hf_logits.double(), -1)
    got = torch.log_softmax(ours.double(), -1)
    kl = (want.exp() * (want - got)).sum(-1)
    agree = (ours.argmax(-1) == hf_logits.argmax(-1)).double().mean().item()
    print(f"\n{served.model.precision_name} ({served.model.weights_name}): top-1 agreement "
          f"{agree:.4f}, mean KL {kl.mean().item():.5f}, max KL {kl.max().item():.4f}")
    assert agree >= MIN_TOP1_AGREEMENT
    assert kl.mean().item() <= MAX_MEAN_KL
