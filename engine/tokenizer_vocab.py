"""BPE vocabularies, read from a GGUF file or an HF `tokenizer.json`: byte-level ones (run by
tiktoken) and Gemma's SentencePiece one (engine.tokenizer_spm).

`BPEVocab` is the model-independent description `engine.tokenizer.Tokenizer` is built from: the raw
bytes of every token, which of them are special, and the pre-tokenizer regex the merges were
learned under.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine import default_templates
from engine.errors import UnsupportedModel
from engine.tokenizer_gguf import read_gguf_metadata
from engine.tokenizer_spm import SPM_ARCHITECTURES, SpmVocab

# GPT-2 pre-tokenizer regex, as HF `ByteLevel(use_regex=True)` applies it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# "smollm" (and starcoder, refact, ...) first isolates every digit (HF `Digits(individual_digits)`,
# llama.cpp's "\p{N}" split) and then runs the GPT-2 regex inside each remaining span. One regex
# does both: `\p{N}` replaces ` ?\p{N}+`, and a whitespace run may end right before a digit because
# in the two-pass version that digit starts a new span ("a   1" -> "a", "   ", "1", not "  ", " ").
SMOLLM_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
)

LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# `tokenizer.ggml.pre` values, grouped as llama.cpp's llama-vocab.cpp groups them.
GGUF_PRE_PATTERNS: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys(
            ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
            SMOLLM_PATTERN,
        ),
        **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais"), GPT2_PATTERN),
        **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe"), LLAMA3_PATTERN),
        **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), QWEN2_PATTERN),
    }
)

GGUF_TOKEN_TYPE_CONTROL = 3
GGUF_TOKEN_TYPE_USER_DEFINED = 4


def _gpt2_byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte -> printable character table: index is the byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


BYTE_ALPHABET: tuple[str, ...] = _gpt2_byte_alphabet()
_ALPHABET_SET = frozenset(BYTE_ALPHABET)
# str.translate table taking each alphabet character back to the code point of its byte value.
_UNSPELL_TABLE: Mapping[int, int] = MappingProxyType(
    {ord(c): b for b, c in enumerate(BYTE_ALPHABET)}
)


def unspell_token(token: str) -> bytes:
    """Raw bytes of a byte-level token string ("Ġhello" -> b" hello").

    A string using characters outside the GPT-2 alphabet is not byte-level spelled (an added token
    stored as plain text); its UTF-8 bytes are returned, as HF transformers does.
    """
    if _ALPHABET_SET.issuperset(token):
        return token.translate(_UNSPELL_TABLE).encode("latin-1")
    return token.encode("utf-8")


@dataclass(frozen=True)
class BPEVocab:
    """A byte-level BPE vocabulary whose token ids are its merge ranks.

    `token_bytes[i]` is token i's raw bytes (a special token's UTF-8 text). `special_tokens` maps
    text to id for tokens matched whole in text instead of being merged. Ids of ordinary tokens
    must follow merge order (checked by `check_merge_order`); that is what lets tiktoken use them
    as ranks.
    """

    token_bytes: tuple[bytes, ...]
    special_tokens: Mapping[str, int]
    pattern: str
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None
    # A SentencePiece vocabulary (Gemma) is run by engine.tokenizer_spm instead of tiktoken;
    # `pattern` is then unused.
    spm: SpmVocab | None = None
    # The family whose standard chat format stands in for a template the file lacks, or None.
    default_template_family: str | None = None
    # Whether a raw prompt (no chat template, which writes its own) starts with BOS.
    add_bos_token: bool = False

    def __post_init__(self) -> None:
        for text, token_id in self.special_tokens.items():
            if not 0 <= token_id < len(self.token_bytes):
                raise UnsupportedModel(f"special token {text!r} has id {token_id} outside vocab")
        for name in ("bos_token_id", "eos_token_id"):
            token_id = getattr(self, name)
            if token_id is not None and not 0 <= token_id < len(self.token_bytes):
                raise UnsupportedModel(f"{name}={token_id} is outside the vocabulary")


def check_merge_order(ids: Mapping[str, int], merges: Iterable[str | Sequence[str]]) -> None:
    """Raise `UnsupportedModel` unless each merge's result outranks its parts and earlier results.

    `ids` maps byte-level spelled tokens to ids; `merges` are "left right" strings or pairs in
    that spelling (the spelling is per byte, so spelled concatenation is byte concatenation).
    tiktoken merges the adjacent pair whose *concatenation* has the lowest rank, HF the pair listed
    first in `merges`. With ids as ranks these agree only when ids grow with merge order.
    """
    last_id = -1
    for index, merge in enumerate(merges):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        merged_id, left_id, right_id = ids.get(left + right), ids.get(left), ids.get(right)
        if merged_id is None or left_id is None or right_id is None:
            raise UnsupportedModel(f"merge #{index} {left!r} + {right!r} is not in the vocabulary")
        if not merged_id > max(left_id, right_id, last_id):
            raise UnsupportedModel(
                f"token ids do not follow merge order at merge #{index} ({left!r} + {right!r})"
            )
        last_id = merged_id


def vocab_from_gguf(path: Path) -> BPEVocab:
    """Read the tokenizer a GGUF file describes. Raises `UnsupportedModel` for anything but a
    byte-level BPE ("gpt2") vocabulary with a known pre-tokenizer or a Gemma SentencePiece one."""
    meta = read_gguf_metadata(path, prefixes=("tokenizer.", "general.architecture"))
    model = meta.get("tokenizer.ggml.model")
    arch = str(meta.get("general.architecture", ""))
    if model == "llama" and arch in SPM_ARCHITECTURES:
        return _spm_vocab_from_gguf(meta, arch)
    if model != "gpt2":
        raise UnsupportedModel(
            f"{path}: tokenizer.ggml.model={model!r} ({arch}); supported: 'gpt2' (byte-level BPE) "
            f"and 'llama' (SentencePiece) for {', '.join(SPM_ARCHITECTURES)}")
    pre = str(meta.get("tokenizer.ggml.pre", "gpt-2"))
    if pre not in GGUF_PRE_PATTERNS:
        raise UnsupportedModel(f"{path}: unknown pre-tokenizer tokenizer.ggml.pre={pre!r}")
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or (1,) * len(tokens)
    special_types = (GGUF_TOKEN_TYPE_CONTROL, GGUF_TOKEN_TYPE_USER_DEFINED)
    kinds = enumerate(zip(tokens, types, strict=True))
    special = {tok: i for i, (tok, kind) in kinds if kind in special_types}
    token_bytes = tuple(
        tok.encode("utf-8") if tok in special else unspell_token(tok) for tok in tokens
    )
    if "tokenizer.ggml.merges" in meta:
        check_merge_order({t: i for i, t in enumerate(tokens)}, meta["tokenizer.ggml.merges"])
    return BPEVocab(
        token_bytes=token_bytes,
        special_tokens=MappingProxyType(special),
        pattern=GGUF_PRE_PATTERNS[pre],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


def _spm_vocab_from_gguf(meta: Mapping[str, Any], arch: str) -> BPEVocab:
    """A SentencePiece vocabulary: control and user-defined pieces are matched whole in text,
    and a file without a chat template gets its family's standard format."""
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or (1,) * len(tokens)
    spm = SpmVocab.from_gguf_tokens(tokens, types, meta.get("tokenizer.ggml.unknown_token_id"))
    special_types = (GGUF_TOKEN_TYPE_CONTROL, GGUF_TOKEN_TYPE_USER_DEFINED)
    special = {tok: i for i, (tok, kind) in enumerate(zip(tokens, types, strict=True))
               if kind in special_types}
    template = meta.get("tokenizer.chat_template")
    family = None
    if template is None and arch in default_templates.BY_ARCHITECTURE:
        family, template = default_templates.BY_ARCHITECTURE[arch]
    return BPEVocab(
        token_bytes=spm.token_bytes(),
        special_tokens=MappingProxyType(special),
        pattern="",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        chat_template=template,
        spm=spm,
        default_template_family=family,
        # transformers' default for SentencePiece files that do not say (llama.cpp's too).
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
    )


def _pattern_from_pre_tokenizer(spec: Mapping[str, Any] | None) -> str:
    """The single regex equivalent to an HF `pre_tokenizer` spec. Raises `UnsupportedModel` for
    shapes other than the three byte-level ones below."""
    spec = spec or {}
    parts = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else [spec]
    kinds = [p.get("type") for p in parts]
    pattern: str | None = None
    if kinds and kinds[-1] == "ByteLevel" and not parts[-1].get("add_prefix_space"):
        use_regex = parts[-1].get("use_regex", True)
        if kinds == ["ByteLevel"] and use_regex:
            pattern = GPT2_PATTERN
        elif kinds == ["Digits", "ByteLevel"] and use_regex and parts[0].get("individual_digits"):
            pattern = SMOLLM_PATTERN
        elif kinds == ["Split", "ByteLevel"] and not use_regex:
            split = parts[0]
            if split.get("behavior") == "Isolated" and not split.get("invert"):
                pattern = split.get("pattern", {}).get("Regex")
    if pattern is None:
        raise UnsupportedModel(f"unsupported tokenizer.json pre_tokenizer: {json.dumps(spec)}")
    return pattern


def vocab_from_tokenizer_json(path: Path) -> BPEVocab:
    """Read an HF `tokenizer.json` (byte-level BPE only), plus the chat template and bos/eos
    tokens from a sibling `tokenizer_config.json` when there is one. Raises `UnsupportedModel`."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback") or spec.get("normalizer"):
        raise UnsupportedModel(f"{path}: only byte-level BPE without a normalizer is supported")
    pattern = _pattern_from_pre_tokenizer(spec.get("pre_tokenizer"))
    by_id: dict[int, bytes] = {i: unspell_token(tok) for tok, i in model["vocab"].items()}
    # Every added token is matched whole in text, special or not, as HF tokenizers does.
    special = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])}
    for text, token_id in special.items():
        by_id[token_id] = text.encode("utf-8")
    if sorted(by_id) != list(range(len(by_id))):
        raise UnsupportedModel(f"{path}: token ids are not contiguous from 0")
    token_bytes = tuple(by_id[i] for i in range(len(by_id)))
    check_merge_order(model["vocab"], model.get("merges", []))

    config_path = path.with_name("tokenizer_config.json")
    config = json.loads(config_path.read_text("utf-8")) if config_path.exists() else {}
    template_path = path.with_name("chat_template.jinja")
    template = config.get("chat_template")
    if template_path.exists():
        template = template_path.read_text(encoding="utf-8")
    if not isinstance(template, str | None):
        raise UnsupportedModel(f"{config_path}: only a single string chat_template is supported")

    def special_id(key: str) -> int | None:
        value = config.get(key)
        text = value.get("content") if isinstance(value, dict) else value
        return special.get(text) if isinstance(text, str) else None

    return BPEVocab(
        token_bytes=token_bytes,
        special_tokens=MappingProxyType(special),
        pattern=pattern,
        bos_token_id=special_id("bos_token"),
        eos_token_id=special_id("eos_token"),
        chat_template=template,
    )
