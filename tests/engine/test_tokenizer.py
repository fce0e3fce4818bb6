"""Tokenizer tests: our tiktoken-backed tokenizer against HF's, on SmolLM2's own GGUF vocabulary.

The oracle is the tokenizer HF transformers builds from the same GGUF file. transformers (5.x)
has no mapping for `tokenizer.ggml.pre = "smollm"` and falls back to the plain GPT-2 split, which
does not isolate digits the way SmolLM2's tokenizer.json (`Digits(individual_digits=True)` then
`ByteLevel`) and llama.cpp ("\\p{N}" then GPT-2) do. The vocab itself proves the model was trained
with isolated digits: no token mixes a numeral with anything else. So the oracle is run two ways:
as transformers built it, on text with numerals removed, and with its pre-tokenizer set to
SmolLM2's, on everything.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import pytest
import regex
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequest, ModelNotFound
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from tests.engine.hf_oracle import HFOracle, load_hf_oracle, oracle_cache_dir

PYTHON_CODE = '''\
class Stack:
    """LIFO."""

    def __init__(self) -> None:
\tself.items: list[int] = []   # tab-indented on purpose

    def push(self, x):
        if x is None:
            raise ValueError("x")
        self.items.append(x ** 2 // 3)
        return {k: v for k, v in zip("abc", range(3))}
'''

CORPUS: dict[str, str] = {
    "python": PYTHON_CODE,
    "tabs": "\tfoo\t\tbar\n\t\n  \t x\t",
    "cjk": "中文分词测试，日本語のテキスト、한국어 문장입니다.",
    "emoji": "Hi 👋🏽! Family: 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, ❤️‍🔥 ok",
    "accents": "Crème brûlée à la façon de Zoë; naïve Ångström, ñandú, Œuvre",
    "rtl": "שלום עולם! مرحبا بالعالم ١٢٣ and back",
    "numbers": "3.14159 1,000,000 0x1F 1e-9 2024-06-01 12:30 v1.2.3 ½ ² ³ Ⅻ 42nd",
    "digits_after_spaces": "a   1 b\t\t2 c\n\n3   \n 4 \u00a05",
    "whitespace": "   leading\n\n\n    trailing    \r\n\r\n \u00a0\u3000 end   ",
    "newlines": "\n\n\n",
    "contractions": "I'm sure you've seen it; we'll go, they'd say it's 'quoted' 'S 'LL",
    "chat": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    ),
    "specials_glued": "x<|endoftext|>y<|im_end|><|im_start|>  <file_sep>z<jupyter_code>1",
    "partial_specials": "<|im_start <|im_end| <|endoftext|",
    "empty": "",
    "json": '{"key": [1, 2.5, null, true], "nested": {"é": "\\u00e9"}}',
    "markdown": "# Title\n\n- item **bold** _it_\n\n```python\nprint('hi')\n```\n",
    "stdlib_json_decoder": inspect.getsource(json.decoder),
    "stdlib_textwrap": inspect.getsource(textwrap),
}

# Characters whose UTF-8 uses a byte SmolLM2 has no token for (0x04, and 0xF1 as a 4-byte lead).
MISSING_BYTE_TEXTS = ["a\x04b", "x\U00040000y", "\x1d\x1d  12 \x13<|im_end|>\x04z", "t\t\x06\tend"]

NUMERAL = regex.compile(r"\p{N}")


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    try:
        return embedded_gguf_path()
    except ModelNotFound as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def tok(gguf_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(gguf_path)


@pytest.fixture(scope="module")
def oracle(
    gguf_path: Path, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> HFOracle:
    return load_hf_oracle(gguf_path, oracle_cache_dir(pytestconfig, tmp_path_factory))


@pytest.fixture(scope="module")
def hf_smollm(oracle: HFOracle) -> tokenizers.Tokenizer:
    return oracle.backend(smollm_pretokenizer=True)


def hf_ids(backend: tokenizers.Tokenizer, text: str) -> list[int]:
    return list(backend.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("name", CORPUS)
def test_encode_matches_hf_with_smollm_pretokenizer(
    tok: Tokenizer, hf_smollm: tokenizers.Tokenizer, name: str
) -> None:
    text = CORPUS[name]
    assert tok.encode(text) == hf_ids(hf_smollm, text)


def test_encode_matches_transformers_gguf_tokenizer_without_numerals(
    tok: Tokenizer, oracle: HFOracle
) -> None:
    as_built = oracle.backend()
    for name, text in CORPUS.items():
        stripped = NUMERAL.sub("", text)
        assert tok.encode(stripped) == hf_ids(as_built, stripped), name


def test_whitespace_run_before_digit_is_one_piece(
    tok: Tokenizer, hf_smollm: tokenizers.Tokenizer
) -> None:
    # The case that separates SmolLM2's split from GPT-2's: the digit starts a new span, so the
    # run of spaces before it stays whole (GPT-2's regex would leave " " to attach to the "1").
    ids = tok.encode("a   1")
    assert [tok.token_bytes(i) for i in ids] == [b"a", b"   ", b"1"]
    assert ids == hf_ids(hf_smollm, "a   1")


@pytest.mark.parametrize("name", CORPUS)
def test_decode_round_trips_and_matches_hf(
    tok: Tokenizer, hf_smollm: tokenizers.Tokenizer, name: str
) -> None:
    text = CORPUS[name]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids) == hf_smollm.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", ["chat", "specials_glued", "partial_specials"])
def test_allow_special_false_encodes_markup_as_text(
    tok: Tokenizer, oracle: HFOracle, name: str
) -> None:
    text = CORPUS[name]
    plain = oracle.backend(smollm_pretokenizer=True)
    plain.encode_special_tokens = True
    ids = tok.encode(text, allow_special=False)
    assert ids == hf_ids(plain, text)
    assert not set(ids) & set(tok.special_tokens.values())
    assert tok.decode(ids) == text


def test_special_tokens_become_single_ids(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == tok.special_tokens["<|im_start|>"] == 1
    assert ids[-2] == tok.special_tokens["<|im_end|>"] == 2


@pytest.mark.parametrize("text", MISSING_BYTE_TEXTS)
def test_bytes_without_a_token_are_dropped_like_hf(
    tok: Tokenizer, hf_smollm: tokenizers.Tokenizer, text: str
) -> None:
    assert tok.encode(text) == hf_ids(hf_smollm, text)


_POOLS = [
    "abcXYZ",
    "0123456789",
    "٠١٢३४½²Ⅻ",
    " ",
    "  \t\n\r\u00a0\u3000",
    "'sltvmdre",
    '.,;:!?-_=+*/\\()[]{}<>"',
    "éàüñçøß",
    "中文日本語한국어",
    "😀🎉👍🏽\u200d♂️",
    "שלוםمرحبا",
]
_SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "|>"]
_pieces = st.one_of(
    st.text(st.sampled_from("".join(_POOLS)), min_size=1, max_size=8),
    st.sampled_from(_SPECIAL_TEXTS),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_pieces, max_size=12).map("".join))
def test_encode_matches_hf_on_random_text(
    tok: Tokenizer, hf_smollm: tokenizers.Tokenizer, text: str
) -> None:
    assert tok.encode(text) == hf_ids(hf_smollm, text)


def test_vocab_facts(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.stop_token_ids[0] == tok.eos_token_id
    assert set(tok.stop_token_ids) == {0, 2}  # <|im_end|> is eos; <|endoftext|> also ends
    assert len(tok.special_tokens) == 17
    with pytest.raises(TypeError):
        tok.special_tokens["<new>"] = 5  # type: ignore[index]


def test_lone_surrogates_encode_as_replacement_character(tok: Tokenizer) -> None:
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")
    assert tok.encode("\x04\udfff") == tok.encode("\ufffd")


def test_decode_rejects_unknown_ids(tok: Tokenizer) -> None:
    for bad in ([-1], [tok.vocab_size], [5, 10**9]):
        with pytest.raises(InvalidRequest):
            tok.decode(bad)
    with pytest.raises(InvalidRequest):
        tok.token_bytes(-3)


def test_stream_decoder_holds_back_split_characters(tok: Tokenizer) -> None:
    text = "ok 😀🎉 中文 ١٢ 👨‍👩‍👧 ẞ"
    ids = tok.encode(text)
    # The test is only meaningful if some token ends mid-character.
    assert any(_is_cut(tok.token_bytes(i)) for i in ids)
    decoder = tok.stream_decoder()
    pieces = [decoder.feed(i) for i in ids]
    assert "" in pieces
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) + decoder.flush() == text


def _is_cut(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.fixture(scope="module")
def fragment_ids(tok: Tokenizer) -> list[int]:
    """Tokens ending in a non-ASCII byte: pieces of multi-byte characters."""
    return [i for i in range(17, tok.vocab_size) if tok.token_bytes(i)[-1] >= 0x80]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_stream_decoder_concatenates_to_decode(
    tok: Tokenizer, fragment_ids: list[int], data: st.DataObject
) -> None:
    # Mostly character fragments, so sequences cut, join and break characters in every way,
    # including into invalid UTF-8.
    any_id = st.integers(0, tok.vocab_size - 1)
    ids = data.draw(st.lists(st.sampled_from(fragment_ids) | any_id, max_size=30))
    decoder = tok.stream_decoder()
    streamed = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    assert streamed == tok.decode(ids)
    assert decoder.feed_many(ids) + decoder.flush() == tok.decode(ids)


def test_from_tokenizer_json_equals_from_gguf(
    tok: Tokenizer, oracle: HFOracle, tmp_path: Path
) -> None:
    spec = json.loads(oracle.tokenizer_json)
    spec["pre_tokenizer"] = json.loads(oracle.backend(smollm_pretokenizer=True).to_str())[
        "pre_tokenizer"
    ]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = {
        "chat_template": oracle.chat_template,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>"},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    from_json = Tokenizer.from_tokenizer_json(tmp_path / "tokenizer.json")
    assert from_json.vocab_size == tok.vocab_size
    assert dict(from_json.special_tokens) == dict(tok.special_tokens)
    assert (from_json.bos_token_id, from_json.eos_token_id) == (1, 2)
    for name, text in CORPUS.items():
        assert from_json.encode(text) == tok.encode(text), name
    assert from_json.chat_template is not None and tok.chat_template is not None
    assert from_json.chat_template.source == tok.chat_template.source
