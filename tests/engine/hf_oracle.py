"""HF transformers' tokenizer for a GGUF file, as a test oracle, cached across test runs.

`AutoTokenizer.from_pretrained(..., gguf_file=...)` takes ~12 s (GGUF parsing plus conversion), so
the first load serializes what it built (the `tokenizers` JSON and the chat template it read) into
pytest's cache; later runs rebuild the same objects from that in well under a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import tokenizers
import transformers
from tokenizers import pre_tokenizers


@dataclass(frozen=True)
class HFOracle:
    """`tokenizer_json`: what transformers built from the GGUF, serialized by `tokenizers`."""

    tokenizer_json: str
    chat_template: str
    bos_token: str
    eos_token: str

    def backend(self, *, smollm_pretokenizer: bool = False) -> tokenizers.Tokenizer:
        """A fresh `tokenizers.Tokenizer`. With `smollm_pretokenizer`, its pre-tokenizer is
        replaced by SmolLM2's own (see `test_tokenizer.py` for why transformers' differs)."""
        backend = tokenizers.Tokenizer.from_str(self.tokenizer_json)
        if smollm_pretokenizer:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                ]
            )
        return backend

    def transformers_tokenizer(self) -> transformers.PreTrainedTokenizerBase:
        """A transformers tokenizer object over `backend()`, for `apply_chat_template`."""
        tok = transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=self.backend(), bos_token=self.bos_token, eos_token=self.eos_token
        )
        tok.chat_template = self.chat_template
        return tok


def load_hf_oracle(gguf_path: Path, cache_dir: Path) -> HFOracle:
    """The oracle for `gguf_path`, from `cache_dir` when a matching entry exists."""
    stat = gguf_path.stat()
    key = f"{gguf_path.name}-{stat.st_size}-{stat.st_mtime_ns}-tf{transformers.__version__}"
    entry = cache_dir / f"{key}.json"
    if entry.exists():
        return HFOracle(**json.loads(entry.read_text(encoding="utf-8")))
    hf = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    oracle = HFOracle(
        tokenizer_json=hf.backend_tokenizer.to_str(),
        chat_template=hf.chat_template,
        bos_token=hf.bos_token,
        eos_token=hf.eos_token,
    )
    entry.write_text(json.dumps(oracle.__dict__), encoding="utf-8")
    return oracle


def oracle_cache_dir(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest's persistent cache folder, or a per-session temp folder without the cache plugin."""
    cache = getattr(config, "cache", None)
    if cache is None:
        folder = tmp_path_factory.getbasetemp() / "hf-oracle"
        folder.mkdir(exist_ok=True)
        return folder
    return Path(cache.mkdir("radixgate-hf-tokenizer"))
