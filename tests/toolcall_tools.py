"""Declared tools with varied schemas (nested objects, enums, arrays, required fields) for the
tool-call tests, in OpenAI's shape. Every string, array and integer is bounded, so even a random
model's constrained output ends within a few hundred tokens."""

from __future__ import annotations

from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "create_event", "description": "Put an event in the calendar",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 32},
            "when": {"type": "object", "properties": {
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                "required": ["date"]},
            "attendees": {"type": "array", "items": {"type": "string", "maxLength": 16},
                          "maxItems": 3}},
            "required": ["title", "when"]}}},
    {"type": "function", "function": {
        "name": "set_flags", "description": "Turn feature flags on or off",
        "parameters": {"type": "object", "properties": {
            "flags": {"type": "array", "items": {"enum": ["dark_mode", "beta", "telemetry"]},
                      "minItems": 1, "maxItems": 3},
            "enabled": {"type": "boolean"}},
            "required": ["flags", "enabled"]}}},
    {"name": "read_file", "description": "Read a file of the repository",  # Anthropic shape
     "input_schema": {"type": "object", "properties": {
         "path": {"type": "string", "maxLength": 40},
         "range": {"type": "object", "properties": {
             "start": {"type": "integer", "minimum": 1, "maximum": 9999},
             "end": {"type": "integer", "minimum": 1, "maximum": 9999}},
             "required": ["start", "end"]}},
         "required": ["path"]}},
]


def schema_of(name: str) -> dict[str, Any]:
    for tool in TOOLS:
        spec = tool.get("function", tool)
        if spec["name"] == name:
            params: dict[str, Any] = spec.get("parameters", spec.get("input_schema"))
            return params
    raise KeyError(name)
