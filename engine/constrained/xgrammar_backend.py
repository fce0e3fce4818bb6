"""`ToolConstraint` → xgrammar grammar → per-request `XGrammarState` (a `TokenGrammar`).

Tool calls are an xgrammar structural tag: each declared tool is a tag
`call_prefix(name) <arguments object matching its schema> CALL_SUFFIX`; "auto" triggers the tags
on `<tool_call>` inside free text, "required" is one or more tags separated by newlines, "named" is
the one tag, "none" is free text excluding `<tool_call>`. With a text schema, free text is one
JSON value instead: "none" is that value alone, "auto" an `or` of that value and the "required"
calls. Special tokens (`<|im_start|>`, ...) are never allowed inside constrained output; the
request's stop tokens end it where the grammar can.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr
from xgrammar import structural_tag as st

from engine.constrained.base import TokenGrammar
from engine.constrained.json_schema import MAX_JSON_WHITESPACE, bounded_strings_as_patterns
from engine.constrained.spec import (
    CALL_OPEN,
    CALL_SEPARATOR,
    CALL_SUFFIX,
    ToolConstraint,
    ToolSchema,
    call_prefix,
)
from engine.errors import InvalidToolSchema
from engine.tokenizer import Tokenizer

__all__ = ["MAX_JSON_WHITESPACE", "XGrammarBackend", "XGrammarState", "arguments_schema",
           "structural_tag", "text_format", "text_schema_error"]


def arguments_schema(tool: ToolSchema) -> dict[str, Any]:
    """The tool's parameters as an object schema (a schema without `type` gets `"object"`).
    Raises `InvalidToolSchema` if it is not JSON or describes something other than an object."""
    schema = tool.parameters_schema
    kind = schema.get("type", "object")
    if kind != "object":
        raise InvalidToolSchema(f"tool {tool.name!r}: parameters must describe an object, "
                                f"not {kind!r}")
    rewritten: dict[str, Any] = bounded_strings_as_patterns({**schema, "type": "object"})
    return rewritten


def text_format(schema: dict[str, Any] | bool) -> st.JSONSchemaFormat:
    """The structural-tag format of free text that must be one JSON value matching `schema`
    (no whitespace around it, runs inside it capped as in calls)."""
    rewritten = bounded_strings_as_patterns(schema)
    return st.JSONSchemaFormat(json_schema=rewritten, max_whitespace_cnt=MAX_JSON_WHITESPACE)


def text_schema_error(schema: dict[str, Any] | bool) -> str | None:
    """Why `schema` does not compile as a text schema (xgrammar's message); None when it does.
    Needs no tokenizer; takes milliseconds for a small schema."""
    try:
        xgr.Grammar.from_structural_tag(st.StructuralTag(format=text_format(schema)))
    except (RuntimeError, ValueError, TypeError) as exc:
        return _short(exc)
    return None


def structural_tag(constraint: ToolConstraint) -> st.StructuralTag:
    """The xgrammar structural tag of `constraint` (see the module docstring)."""
    tags = [st.TagFormat(begin=call_prefix(tool.name),
                         content=st.JSONSchemaFormat(json_schema=arguments_schema(tool),
                                                     max_whitespace_cnt=MAX_JSON_WHITESPACE),
                         end=CALL_SUFFIX)
            for tool in constraint.chosen_tools]
    fmt: st.Format
    is_single = not constraint.enable_parallel_calls
    schema = constraint.text_schema_value
    text = None if schema is None else text_format(schema)
    calls = st.TagsWithSeparatorFormat(tags=tags, separator=CALL_SEPARATOR, at_least_one=True,
                                       stop_after_first=is_single)
    if constraint.mode == "none" or not tags:
        fmt = st.AnyTextFormat(excludes=[CALL_OPEN]) if text is None else text
    elif constraint.mode == "auto" and text is not None:
        # Exact: the JSON answer or the calls. The calls take the "required" shape because
        # text before a call would be text outside the schema.
        fmt = st.OrFormat(elements=[text, calls])
    elif constraint.mode == "auto":
        fmt = st.TriggeredTagsFormat(triggers=[CALL_OPEN], tags=tags, stop_after_first=is_single)
    elif constraint.mode == "required":
        fmt = calls
    else:
        fmt = tags[0]
    return st.StructuralTag(format=fmt)


class XGrammarState:
    """A `TokenGrammar` over one xgrammar matcher."""

    __slots__ = ("_matcher", "_num_accepted")

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher
        self._num_accepted = 0

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        return bool(self._matcher.fill_next_token_bitmask(bitmask, row))

    def accept_token(self, token_id: int) -> bool:
        accepted = bool(self._matcher.accept_token(token_id))
        self._num_accepted += accepted
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} of {self._num_accepted} tokens")
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self._num_accepted -= num_tokens

    @property
    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    @property
    def num_accepted(self) -> int:
        return self._num_accepted


class XGrammarBackend:
    """Compiles constraints for one vocabulary and masks logits. Compiled grammars are cached by
    constraint (LRU of `max_cached`). Not thread-safe: one per engine, used from its thread."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, *, max_cached: int = 64) -> None:
        """`vocab_size`: the model's logits width (>= the tokenizer's, if padded)."""
        special_ids = set(tokenizer.special_tokens.values())
        # Special tokens as empty strings: xgrammar then never allows them as text.
        encoded = [b"" if i in special_ids else tokenizer.token_bytes(i)
                   for i in range(tokenizer.vocab_size)]
        self.vocab_size = vocab_size
        self._info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab_size,
                                       stop_token_ids=list(tokenizer.stop_token_ids))
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[ToolConstraint, xgr.CompiledGrammar] = OrderedDict()
        self._max_cached = max_cached

    def new_grammar(self, constraint: ToolConstraint,
                    stop_token_ids: Sequence[int]) -> XGrammarState:
        """A fresh state for one request; `stop_token_ids` (non-empty) end the output where the
        grammar allows an end. Raises `InvalidToolSchema` if a schema (of a tool or of the
        text) does not compile."""
        compiled = self._cache.get(constraint)
        if compiled is None:
            try:
                compiled = self._compiler.compile_structural_tag(structural_tag(constraint))
            except (RuntimeError, ValueError, TypeError) as exc:
                raise InvalidToolSchema(f"schemas do not compile: {_short(exc)}") from exc
            self._cache[constraint] = compiled
            if len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(constraint)
        return XGrammarState(xgr.GrammarMatcher(compiled,
                                                override_stop_tokens=list(stop_token_ids)))

    def mask_logits(self, logits: torch.Tensor,
                    grammars: Sequence[TokenGrammar | None]) -> None:
        """Set the logits of tokens each row's grammar forbids to -inf, in place. `logits`: fp32,
        (len(grammars), vocab_size), CPU or GPU; rows whose grammar is None are left alone."""
        if all(g is None for g in grammars):
            return
        bitmask = xgr.allocate_token_bitmask(len(grammars), self.vocab_size)
        needed = [i for i, g in enumerate(grammars)
                  if g is not None and g.fill_next_token_bitmask(bitmask, i)]
        if needed:
            xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device),
                                            vocab_size=self.vocab_size, indices=needed)


def _short(exc: Exception) -> str:
    # xgrammar prefixes C++ errors with a timestamp and a source location.
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text

