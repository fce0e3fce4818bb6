"""SentencePiece BPE vocabularies (Gemma's), read from a GGUF file and run by HF `tokenizers`.

A GGUF with `tokenizer.ggml.model = "llama"` stores a SentencePiece vocabulary: pieces spelled
with "▁" for a space, `<0xNN>` byte-fallback pieces for bytes no piece covers, control and
user-defined tokens, and no merges. Unlike a byte-level BPE a piece's first merge step is a whole
character, so tiktoken cannot run it; this module rebuilds the merges from the vocabulary and
hands them to a `tokenizers` BPE model with byte fallback (its Rust BPE is one pass over the whole
text, with no pre-split).

Gemma's merge order is the order its pieces appear in the file (their scores do not follow it):
a piece earlier in the file merges first, and of two ways to build one piece the one with the
longer left part first. A piece of two or more spaces is stored as real spaces; it is looked up
as "▁"s, as the normalizer writes them. This is what transformers builds for the same file
(tests/engine/test_tokenizer_spm.py holds the two to each other on a corpus).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from engine.errors import UnsupportedModel

SPACE = "\u2581"  # SentencePiece's "▁"
CONTROL, USER_DEFINED, BYTE = 3, 4, 6  # tokenizer.ggml.token_type values
# Architectures whose SentencePiece vocabulary this module builds (merge order = file order).
SPM_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class SpmVocab:
    """The pieces as the encoder looks them up (multi-space pieces respelled), their token
    types, and the unknown piece."""

    pieces: tuple[str, ...]
    token_types: tuple[int, ...]
    unk_token: str

    @classmethod
    def from_gguf_tokens(cls, tokens: Sequence[str], token_types: Sequence[int],
                         unk_id: int | None) -> SpmVocab:
        if len(tokens) != len(token_types):
            raise UnsupportedModel("GGUF token list and token types differ in length")
        pieces = tuple(SPACE * len(t) if t and not t.strip(" ") else t for t in tokens)
        unk = pieces[unk_id] if unk_id is not None and 0 <= unk_id < len(pieces) else "<unk>"
        return cls(pieces, tuple(int(t) for t in token_types), unk)

    def token_bytes(self) -> tuple[bytes, ...]:
        """Raw bytes of every token: "▁" as a space, `<0xNN>` byte pieces as that byte, control
        tokens as their text."""
        out = []
        for piece, kind in zip(self.pieces, self.token_types, strict=True):
            match = _BYTE_PIECE.fullmatch(piece) if kind == BYTE else None
            if match:
                out.append(bytes((int(match.group(1), 16),)))
            elif kind == CONTROL:
                out.append(piece.encode("utf-8"))
            else:
                out.append(piece.replace(SPACE, " ").encode("utf-8"))
        return tuple(out)

    def merges(self) -> list[tuple[str, str]]:
        """Every (left, right) split of a piece into two pieces, earlier pieces first, then the
        longer left part first."""
        ids = {piece: i for i, piece in enumerate(self.pieces)}
        found: list[tuple[int, int, str, str]] = []
        for i, piece in enumerate(self.pieces):
            for cut in range(1, len(piece)):
                left, right = piece[:cut], piece[cut:]
                if left in ids and right in ids:
                    found.append((i, -cut, left, right))
        found.sort(key=lambda m: (m[0], m[1], -len(m[3])))
        return [(left, right) for _, _, left, right in found]


class SpmEncoder:
    """Text -> ids with a SentencePiece BPE vocabulary. Thread-safe: calls never mutate a
    `tokenizers` object once built."""

    def __init__(self, vocab: SpmVocab) -> None:
        self._with_special = _build(vocab)
        self._plain: Tokenizer | None = None  # built on first use (a second for 262k pieces)
        self._lock = threading.Lock()

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Ids of `text`, no BOS. With `allow_special`, control-token text becomes its id;
        without, it is encoded as ordinary text. User-defined pieces (runs of newlines, ...)
        are matched whole either way, as SentencePiece matches them."""
        tokenizer = self._with_special if allow_special else self._plain_encoder()
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    def _plain_encoder(self) -> Tokenizer:
        with self._lock:
            if self._plain is None:
                plain = Tokenizer.from_str(self._with_special.to_str())
                plain.encode_special_tokens = True
                self._plain = plain
            return self._plain


def _build(vocab: SpmVocab) -> Tokenizer:
    """The `tokenizers` model of `vocab` (GemmaTokenizer's shape: BPE with byte fallback over
    text whose spaces became "▁")."""
    ids = {piece: i for i, piece in enumerate(vocab.pieces)}
    if len(ids) != len(vocab.pieces):
        raise UnsupportedModel("the SentencePiece vocabulary spells two tokens the same")
    tokenizer = Tokenizer(BPE(vocab=ids, merges=vocab.merges(), fuse_unk=True,
                              unk_token=vocab.unk_token, byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    # Gemma splits on spaces before the merges, which after the normalizer meets none: one
    # piece of BPE over the whole text.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    kinds = zip(vocab.pieces, vocab.token_types, strict=True)
    control, user = [], []
    for piece, kind in kinds:
        if kind == CONTROL:
            control.append(AddedToken(piece, normalized=False, special=True))
        elif kind == USER_DEFINED:
            user.append(AddedToken(piece, normalized=False, special=False))
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)
    return tokenizer
