"""Chat template tests: whole renders, per-message deltas, generation prompt, and HF equality."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from engine.chat_template import ChatTemplate
from engine.errors import InvalidRequest, ModelNotFound, UnsupportedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from tests.engine.hf_oracle import HFOracle, load_hf_oracle, oracle_cache_dir

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "user_only": [{"role": "user", "content": "Hi!"}],
    "with_system": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Quatre."},
        {"role": "user", "content": "Et 3+3 ?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Write a haiku\nabout tabs\t."},
        {"role": "assistant", "content": "Indent, then again—\n  spaces argue with the tab\n😀"},
        {"role": "user", "content": "  leading spaces and <b>html</b>  "},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": '{"result": [1, 2, 3]}'},
    ],
}


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
def template(tok: Tokenizer) -> ChatTemplate:
    assert tok.chat_template is not None
    return tok.chat_template


@pytest.fixture(scope="module")
def oracle(
    gguf_path: Path, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> HFOracle:
    return load_hf_oracle(gguf_path, oracle_cache_dir(pytestconfig, tmp_path_factory))


@pytest.fixture(scope="module")
def hf_tokenizer(oracle: HFOracle) -> transformers.PreTrainedTokenizerBase:
    return oracle.transformers_tokenizer()


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_whole_render_is_concatenation_of_deltas(template: ChatTemplate, name: str) -> None:
    messages = CONVERSATIONS[name]
    deltas = [template.render_delta(messages[:i], [messages[i]]) for i in range(len(messages))]
    assert "".join(deltas) == template.render(messages)
    # Each ChatML delta is exactly one "<|im_start|>role\n...<|im_end|>\n" block (plus the default
    # system block in front of a non-system first message).
    assert all(d.endswith("<|im_end|>\n") for d in deltas)
    assert [d.count("<|im_start|>") for d in deltas[1:]] == [1] * (len(deltas) - 1)


def test_default_system_prompt_only_without_a_system_message(template: ChatTemplate) -> None:
    without = template.render(CONVERSATIONS["user_only"])
    assert without == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    )
    assert DEFAULT_SYSTEM not in template.render(CONVERSATIONS["with_system"])
    first_delta = template.render_delta([], CONVERSATIONS["user_only"])
    assert first_delta == without


@pytest.mark.parametrize("name", ["empty", *CONVERSATIONS])
def test_generation_prompt_is_a_suffix(template: ChatTemplate, name: str) -> None:
    messages = CONVERSATIONS.get(name, [])
    assert template.generation_prompt() == "<|im_start|>assistant\n"
    prompted = template.render(messages, add_generation_prompt=True)
    assert prompted == template.render(messages) + template.generation_prompt()
    if messages:
        delta = template.render_delta(messages[:-1], messages[-1:], add_generation_prompt=True)
        assert template.render(messages[:-1]) + delta == prompted


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_render_matches_hf_apply_chat_template(
    template: ChatTemplate,
    hf_tokenizer: transformers.PreTrainedTokenizerBase,
    name: str,
    add_generation_prompt: bool,
) -> None:
    messages = CONVERSATIONS[name]
    expected = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert template.render(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_delta_tokens_equal_slice_of_whole_tokens(
    tok: Tokenizer, template: ChatTemplate, name: str
) -> None:
    # ChatML turns start and end with special tokens, so tokenization never merges across them.
    messages = CONVERSATIONS[name]
    for split in range(len(messages) + 1):
        history, new = messages[:split], messages[split:]
        whole = tok.encode(template.render(messages, add_generation_prompt=True))
        head = tok.encode(template.render(history))
        delta = tok.encode(template.render_delta(history, new, add_generation_prompt=True))
        assert head + delta == whole


def test_text_blocks_render_like_a_string(template: ChatTemplate) -> None:
    blocks = [{"type": "text", "text": "Hello, "}, "big ", {"type": "text", "text": "world"}]
    as_blocks = template.render([{"role": "user", "content": blocks}])
    assert as_blocks == template.render([{"role": "user", "content": "Hello, big world"}])
    assert template.render([{"role": "assistant", "content": None}]).endswith(
        "<|im_start|>assistant\n<|im_end|>\n"
    )
    with pytest.raises(InvalidRequest, match="text content"):
        template.render([{"role": "user", "content": [{"type": "image", "source": "x"}]}])
    with pytest.raises(InvalidRequest, match="role"):
        template.render([{"content": "no role"}])


CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_that_rewrites_history_is_refused() -> None:
    # Shows only the last two messages: appending one drops the first from the rendering.
    window = ChatTemplate(
        "{% for m in messages[-2:] %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(UnsupportedModel, match="prefix-stable"):
        window.render_delta(history, [{"role": "user", "content": "c"}])


def test_raise_exception_is_an_invalid_request() -> None:
    strict = ChatTemplate(
        "{% if messages and messages[0]['role'] == 'assistant' %}"
        "{{ raise_exception('first message must not be assistant') }}{% endif %}" + CHATML
    )
    with pytest.raises(InvalidRequest, match="must not be assistant"):
        strict.render([{"role": "assistant", "content": "x"}])


def test_sandbox_blocks_mutation_and_bad_templates_are_unsupported() -> None:
    mutating = ChatTemplate(
        "{% if messages | length > 1 %}{{ messages.append(1) }}{% endif %}" + CHATML
    )
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    with pytest.raises(InvalidRequest, match="unsafe"):
        mutating.render(messages)
    assert len(messages) == 2
    with pytest.raises(UnsupportedModel, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(UnsupportedModel, match="one user message"):
        ChatTemplate("{{ raise_exception('needs a system message') }}")


def test_hf_jinja_settings() -> None:
    # trim_blocks/lstrip_blocks drop block-tag lines; tojson keeps non-ASCII text.
    template = ChatTemplate(
        "{% for m in messages %}\n    {{ m['content'] | tojson }}\n{% endfor %}", "<s>", "</s>"
    )
    assert template.render([{"role": "user", "content": "é"}]) == '    "é"\n'
    with_tokens = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}",
        "<s>",
        "</s>",
    )
    assert with_tokens.render([{"role": "user", "content": "x"}]) == "<s>x</s>"
