"""The engine's tokenizer: the model's own BPE vocabulary, byte-level run by tiktoken or
SentencePiece (Gemma) run by engine.tokenizer_spm.

Byte-level: token ids are tiktoken ranks (`tokenizer_vocab.check_merge_order` proves that sound
for a vocab), special tokens are tiktoken special tokens, and the pre-tokenizer regex is the
model's. Either way decoding is by each token's raw bytes.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import regex
import tiktoken

from engine.chat_template import ChatTemplate
from engine.errors import InvalidRequest, UnsupportedModel
from engine.tokenizer_spm import SpmEncoder
from engine.tokenizer_vocab import BPEVocab, vocab_from_gguf, vocab_from_tokenizer_json

# End-of-turn/-text control tokens that stop generation besides eos (llama.cpp's end-of-generation
# set): a chat model that emits any of them has finished, whatever the file's eos says.
STOP_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


class Tokenizer:
    """Text <-> token ids for one model. Immutable after construction and safe to share between
    threads. Ids are `int`s in `[0, vocab_size)`."""

    __slots__ = (
        "_vocab",
        "_encoding",
        "_spm",
        "_ranks",
        "_missing_bytes",
        "_pattern",
        "_special_pattern",
        "_chat_template",
        "_stop_token_ids",
        "_vocab_hash",
    )

    def __init__(self, vocab: BPEVocab) -> None:
        """Build from a checked vocabulary. Raises `UnsupportedModel` if tiktoken rejects it."""
        specials = vocab.special_tokens
        self._vocab = vocab
        self._finish(vocab)
        self._spm: SpmEncoder | None = None
        self._encoding: tiktoken.Encoding | None = None
        if vocab.spm is not None:
            self._spm = SpmEncoder(vocab.spm)
            # Byte fallback covers every byte; special tokens are matched by the encoder.
            self._missing_bytes = b""
            return
        special_ids = set(specials.values())
        ranks = {b: i for i, b in enumerate(vocab.token_bytes) if i not in special_ids}
        self._ranks: Mapping[bytes, int] = MappingProxyType(ranks)
        # Bytes with no single-byte token: text holding them takes `_encode_dropping` (see there).
        self._missing_bytes = bytes(b for b in range(256) if bytes((b,)) not in ranks)
        self._pattern = regex.compile(vocab.pattern)
        # tiktoken tries special tokens in hash order, HF longest first; they agree only when no
        # special token is a prefix of another (then at most one can match at a position).
        ordered = sorted(specials)
        for shorter, longer in zip(ordered, ordered[1:], strict=False):
            if longer.startswith(shorter):
                raise UnsupportedModel(f"special token {shorter!r} is a prefix of {longer!r}")
        self._special_pattern = regex.compile("|".join(map(regex.escape, ordered)) or r"(?!)")
        try:
            self._encoding = tiktoken.Encoding(
                name="radixgate",
                pat_str=vocab.pattern,
                mergeable_ranks=ranks,
                special_tokens=dict(specials),
                explicit_n_vocab=len(vocab.token_bytes),
            )
        except (AssertionError, ValueError) as exc:
            raise UnsupportedModel(f"tiktoken rejected the vocabulary: {exc}") from exc

    def _finish(self, vocab: BPEVocab) -> None:
        """What every vocabulary kind sets: chat template, stop ids and the vocabulary hash."""
        specials = vocab.special_tokens
        self._chat_template = _chat_template_for(vocab)
        stop = [vocab.eos_token_id, *map(specials.get, STOP_TOKEN_TEXTS)]
        self._stop_token_ids = tuple(dict.fromkeys(i for i in stop if i is not None))
        digest = hashlib.sha256(vocab.pattern.encode())
        for token in vocab.token_bytes:
            digest.update(len(token).to_bytes(4, "little") + token)
        digest.update(json.dumps(sorted(specials.items())).encode())
        if vocab.spm is not None:  # the pieces decide the merges, beyond their bytes
            digest.update("\x00".join(vocab.spm.pieces).encode())
        self._vocab_hash = digest.hexdigest()[:32]

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """The tokenizer stored in a GGUF file's metadata (reads no tensor data)."""
        return cls(vocab_from_gguf(Path(path)))

    @classmethod
    def from_tokenizer_json(cls, path: str | Path) -> Tokenizer:
        """An HF `tokenizer.json` (plus sibling `tokenizer_config.json` when present)."""
        return cls(vocab_from_tokenizer_json(Path(path)))

    @classmethod
    def from_model_path(cls, path: str | Path) -> Tokenizer:
        """A `.gguf` file, or an HF model folder holding `tokenizer.json`."""
        path = Path(path)
        if path.is_dir():
            return cls.from_tokenizer_json(path / "tokenizer.json")
        return cls.from_gguf(path)

    @property
    def vocab_hash(self) -> str:
        """A digest of the vocabulary (token bytes in id order, specials, split pattern): two
        tokenizers with the same hash map text to the same ids."""
        return self._vocab_hash

    @property
    def vocab_size(self) -> int:
        return len(self._vocab.token_bytes)

    @property
    def bos_token_id(self) -> int | None:
        return self._vocab.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._vocab.eos_token_id

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: eos first, then those of `STOP_TOKEN_TEXTS` the vocab has."""
        return self._stop_token_ids

    @property
    def special_tokens(self) -> Mapping[str, int]:
        """Text -> id of every special (control) token. Read-only."""
        return self._vocab.special_tokens

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    @property
    def add_bos_token(self) -> bool:
        """Whether a raw prompt should start with BOS (the file's `add_bos_token`); chat
        templates write their own."""
        return self._vocab.add_bos_token and self._vocab.bos_token_id is not None

    @property
    def default_template_family(self) -> str | None:
        """The family whose standard chat format stands in for a template the model's file
        lacks (e.g. "Gemma"), or None when the file has its own."""
        return self._vocab.default_template_family

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of `text`; no BOS is added. With `allow_special`, special-token strings in
        `text` become their ids; otherwise they are encoded as ordinary text. Characters whose
        bytes have no token are dropped, as HF tokenizers and llama.cpp drop them."""
        if self._spm is not None:
            return self._spm.encode(text, allow_special=allow_special)
        if self._missing_bytes:
            try:
                raw = text.encode("utf-8")
            except UnicodeEncodeError:
                text = _replace_surrogates(text)
                raw = text.encode("utf-8")
            if len(raw.translate(None, self._missing_bytes)) != len(raw):
                return self._encode_dropping(text, allow_special)
        encoding = self._encoding
        if encoding is None:  # unreachable: built for every byte-level vocabulary
            raise RuntimeError("tokenizer has no encoder")
        if allow_special:
            return encoding.encode(text, allowed_special="all")
        return encoding.encode_ordinary(text)

    def decode_bytes(self, token_ids: Iterable[int]) -> bytes:
        """Concatenated raw bytes of `token_ids` (special tokens as their text). Raises
        `InvalidRequest` for an id outside the vocabulary."""
        token_bytes = self._vocab.token_bytes
        ids = token_ids if isinstance(token_ids, list | tuple) else list(token_ids)
        if ids and not (0 <= min(ids) and max(ids) < len(token_bytes)):
            raise InvalidRequest(f"token id outside [0, {len(token_bytes)}) in {ids!r:.200}")
        return b"".join([token_bytes[i] for i in ids])

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text of `token_ids`; invalid UTF-8 (a character cut mid-way) becomes U+FFFD."""
        return self.decode_bytes(token_ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token. Raises `InvalidRequest` for an id outside the vocabulary."""
        if not 0 <= token_id < len(self._vocab.token_bytes):
            raise InvalidRequest(f"token id {token_id} outside [0, {self.vocab_size})")
        return self._vocab.token_bytes[token_id]

    def stream_decoder(self) -> StreamDecoder:
        """A fresh incremental decoder over this vocabulary."""
        return StreamDecoder(self)

    def _encode_dropping(self, text: str, allow_special: bool) -> list[int]:
        """Slow path for text holding bytes with no single-byte token (SmolLM2 lacks 21, e.g.
        0x04 and the 4-byte UTF-8 leads 0xF1/0xF2). tiktoken would panic on them; HF drops such
        characters *after* pre-tokenization, so the split must see them and the merges must not."""
        special = self._vocab.special_tokens
        ids: list[int] = []
        start = 0
        matches = self._special_pattern.finditer(text) if allow_special else iter(())
        for match in [*matches, None]:
            end = match.start() if match else len(text)
            for piece in self._pattern.finditer(text, start, end):
                kept = piece.group().encode("utf-8").translate(None, self._missing_bytes)
                if kept:
                    ids.extend(_byte_pair_encode(kept, self._ranks))
            if match:
                ids.append(special[match.group()])
                start = match.end()
        return ids


def _replace_surrogates(text: str) -> str:
    """Lone surrogates (not encodable as UTF-8) as U+FFFD, which is what tiktoken does."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _byte_pair_encode(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """tiktoken's merge rule in Python: repeatedly join the adjacent pair whose concatenation has
    the lowest rank, leftmost first. Every single byte of `piece` must be in `ranks`."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_idx: int | None = None
        best_rank = 0
        for idx in range(len(parts) - 1):
            rank = ranks.get(parts[idx] + parts[idx + 1])
            if rank is not None and (best_idx is None or rank < best_rank):
                best_idx, best_rank = idx, rank
        if best_idx is None:
            break
        parts[best_idx : best_idx + 2] = [parts[best_idx] + parts[best_idx + 1]]
    return [ranks[p] for p in parts]


def _chat_template_for(vocab: BPEVocab) -> ChatTemplate | None:
    if vocab.chat_template is None:
        return None

    def text(token_id: int | None) -> str:
        return "" if token_id is None else vocab.token_bytes[token_id].decode("utf-8", "replace")

    return ChatTemplate(vocab.chat_template, text(vocab.bos_token_id), text(vocab.eos_token_id))


class StreamDecoder:
    """Incremental detokenizer for one output stream: `feed` token ids one at a time and get text
    back only once it forms whole UTF-8 characters. `"".join(feed(i) for i in ids) + flush()`
    equals `tokenizer.decode(ids)`. Mutable, one per stream, not thread-safe."""

    __slots__ = ("_tokenizer", "_utf8")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        # CPython's incremental decoder holds back an incomplete trailing sequence and replaces
        # invalid bytes exactly as a one-shot `bytes.decode(errors="replace")` would.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by `token_id` (possibly ""). Raises `InvalidRequest` for a bad id."""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def feed_many(self, token_ids: Sequence[int]) -> str:
        """Same as joining `feed` over `token_ids`."""
        return self._utf8.decode(self._tokenizer.decode_bytes(token_ids))

    def flush(self) -> str:
        """Flush held-back bytes (a cut-off character becomes U+FFFD) and reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
