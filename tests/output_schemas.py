"""JSON schemas for the structured-output tests (nested objects, enums, arrays, required and
optional fields, a nullable union). Every string, array and integer is bounded, so even a random
model's constrained answer ends within a few hundred tokens."""

from __future__ import annotations

from typing import Any

PERSON: dict[str, Any] = {
    "type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]}},
    "required": ["name", "age", "role"], "additionalProperties": False}

ORDER: dict[str, Any] = {
    "type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {
                "sku": {"type": "string", "enum": ["A1", "B2", "C3"]},
                "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "shipping": {"type": "object", "properties": {
            "method": {"enum": ["ground", "air"]},
            "express": {"type": "boolean"}},
            "required": ["method", "express"], "additionalProperties": False},
        "note": {"type": "string", "maxLength": 16}},
    "required": ["id", "items", "shipping"], "additionalProperties": False}

TAGS: dict[str, Any] = {
    "type": "object", "properties": {
        "tags": {"type": "array", "maxItems": 4,
                 "items": {"type": "string", "enum": ["red", "green", "blue"]}},
        "score": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10},
                            {"type": "null"}]},
        "done": {"type": "boolean"}},
    "required": ["tags", "score", "done"], "additionalProperties": False}

SCHEMAS: dict[str, dict[str, Any]] = {"person": PERSON, "order": ORDER, "tags": TAGS}

# Valid JSON Schemas the grammar engine cannot honour, and the words the 400 must name.
UNSUPPORTED: dict[str, tuple[dict[str, Any], str]] = {
    "backreference": ({"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^(ab)\\1$"}}}, "Backreference"),
    "not": ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                    "'uniqueItems'"),
}
INVALID_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "strnig"}}}


def json_schema_format(name: str, schema: dict[str, Any], *, strict: bool = True
                       ) -> dict[str, Any]:
    """OpenAI Chat's `response_format` (also the native shape) of `schema`."""
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": strict}}
