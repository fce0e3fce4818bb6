"""Structured output requests: a route's `response_format` in the native shape, checked against
the grammar engine before anything is written.

Native shape (`GenerateOptions.response_format`; every route maps to it):

    {"type": "json_schema", "json_schema": {"name", "schema", "strict"[, "description"]}}
    {"type": "json_object"}                 any JSON object
    None                                    plain text ({"type": "text"} normalizes to it)

`normalize_response_format` also takes the flat shape of the Responses API's `text.format` and
of Anthropic's `output_config.format` (`{"type": "json_schema", "schema", "name"?}`). Each problem
is a 400 (`InvalidRequest` naming the request field): an unknown type, a schema that is not a
valid JSON Schema, one using a keyword the grammar engine would ignore
(`engine.constrained.json_schema.unsupported_feature`), one it cannot compile. `strict` is kept
for the client's sake: the output is constrained either way.

The prompt note (`format_note`): a 135M model follows a schema far better when it is told, so
the turn that asks for structured output gets one short instruction with the schema, appended
to its own last message as the model sees it (`gateway.rendering`). Only that turn's delta
changes: earlier turns' tokens, and so their cache, are untouched.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from engine.constrained.json_schema import unsupported_feature
from engine.constrained.spec import ToolConstraint
from gateway.errors import InvalidRequest

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}  # what `json_object` constrains to
DEFAULT_NAME = "response"
_TYPES = ("text", "json_object", "json_schema")


def normalize_response_format(raw: Mapping[str, Any] | None, *,
                              param: str) -> dict[str, Any] | None:
    """The native shape of `raw` (see the module docstring), None for text. `param`: the
    request field `raw` came from, as the client named it ("response_format",
    "text.format", "output_config.format"), for the 400s. Raises `InvalidRequest`."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"{param}: must be an object", param=param)
    kind = raw.get("type")
    if kind not in _TYPES:
        raise InvalidRequest(f"{param}.type: {kind!r} is not one of 'text', 'json_object', "
                             "'json_schema'", param=f"{param}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    spec = raw.get("json_schema", raw if "schema" in raw else None)
    where = f"{param}.json_schema" if "json_schema" in raw else param
    if not isinstance(spec, Mapping):
        raise InvalidRequest(f"{param}.json_schema: required for type 'json_schema'",
                             param=f"{param}.json_schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict | bool):
        raise InvalidRequest(f"{where}.schema: a JSON schema (an object) is required",
                             param=f"{where}.schema")
    name = spec.get("name", DEFAULT_NAME)
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name: must be a non-empty string", param=f"{where}.name")
    problem = schema_problem(schema_text(schema))
    if problem is not None:
        raise InvalidRequest(f"{param}: {problem}", param=param)
    out: dict[str, Any] = {"name": name, "schema": schema, "strict": spec.get("strict") is True}
    if isinstance(spec.get("description"), str):
        out["description"] = spec["description"]
    return {"type": "json_schema", "json_schema": out}


def text_schema(fmt: Mapping[str, Any] | None) -> str | None:
    """The engine constraint's `text_schema` of a normalized format (None for text)."""
    if fmt is None:
        return None
    if fmt["type"] == "json_object":
        return schema_text(JSON_OBJECT_SCHEMA)
    return schema_text(fmt["json_schema"]["schema"])


def schema_text(schema: dict[str, Any] | bool) -> str:
    """A schema as compact JSON text. Key order is kept: it is the order the grammar makes the
    model write properties in."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def format_note(fmt: Mapping[str, Any] | None, constraint: ToolConstraint | None) -> str | None:
    """The instruction added to the turn (see the module docstring) whose output `constraint`
    constrains; None for text, and where the constraint has no text schema (calls only)."""
    if fmt is None or constraint is None or constraint.text_schema is None:
        return None
    may_call = bool(constraint.chosen_tools)
    lead = "If you answer without calling a tool, answer" if may_call else "Answer"
    if fmt["type"] == "json_object":
        # "on one line": the model's own pretty-printing nests deeper than the grammar's
        # whitespace cap (MAX_JSON_WHITESPACE) lets it, and it rambles once pushed off it.
        return f"{lead} with a JSON object only, written compactly on one line."
    spec = fmt["json_schema"]
    about = f" ({spec['description']})" if spec.get("description") else ""
    return (f"{lead} with JSON only, matching this JSON schema{about}:\n"
            f"{schema_text(spec['schema'])}")


@functools.lru_cache(maxsize=256)
def schema_problem(text: str) -> str | None:
    """Why the schema (`schema_text`) cannot constrain output, as a sentence naming what is
    wrong or unsupported; None when it can. A memo of a pure function: agents send one schema
    on every turn, and compiling one takes milliseconds."""
    schema = json.loads(text)
    if schema is False:
        return "the schema `false` matches no value"
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        at = "/".join(str(p) for p in exc.path)
        return f"invalid JSON Schema at #/{at}: {exc.message}"
    feature = unsupported_feature(schema)
    if feature is not None:
        return (f"the grammar engine does not support {feature}; the output could not be "
                "guaranteed to match")
    # Imported here, not at the top: xgrammar loads torch, which only requests with a schema
    # should pay for in a gateway process.
    from engine.constrained.xgrammar_backend import text_schema_error

    error = text_schema_error(schema)
    return None if error is None else f"the grammar engine does not support this schema: {error}"
