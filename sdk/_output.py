"""Structured output of the agent loop: an `output_type` (a pydantic model class or a JSON-schema
dict) as the `response_format` every turn of a run sends, and as the parser of its final answer.

The gateway constrains the answer to the schema with its grammar engine, so parsing fails only
when the answer was cut short (`max_tokens`) or the schema says less than the model class
checks (a pydantic validator, say): then `OutputError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from sdk._errors import RadixgateError

OutputTypeLike = type[BaseModel] | Mapping[str, Any]


class OutputError(RadixgateError, ValueError):
    """The final answer does not parse as the loop's `output_type`. `text`: the answer."""

    def __init__(self, message: str, text: str) -> None:
        super().__init__(message)
        self.text = text


@dataclass(frozen=True)
class OutputType:
    """`response_format`: the native `generate.response_format` of the schema (strict);
    `model`: the pydantic class answers are validated into (None: plain JSON values)."""

    response_format: dict[str, Any]
    model: type[BaseModel] | None = None

    @classmethod
    def of(cls, spec: OutputTypeLike) -> OutputType:
        """Raises TypeError unless `spec` is a pydantic model class or a JSON-schema dict."""
        if isinstance(spec, type) and issubclass(spec, BaseModel):
            return cls(_json_schema_format(spec.__name__, spec.model_json_schema()), spec)
        if isinstance(spec, Mapping):
            return cls(_json_schema_format(str(spec.get("title") or "output"), dict(spec)))
        raise TypeError(f"output_type must be a pydantic model class or a JSON schema dict, "
                        f"not {spec!r}")

    def parse(self, text: str) -> Any:
        """The answer as a model instance (or the JSON value). Raises OutputError."""
        try:
            if self.model is not None:
                return self.model.model_validate_json(text)
            return json.loads(text)
        except (ValidationError, ValueError) as exc:
            raise OutputError(f"the final answer is not a valid {self._name}: {exc}",
                              text) from exc

    @property
    def _name(self) -> str:
        return str(self.response_format["json_schema"]["name"])


def _json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    # OpenAI's rule for names (the gateway takes any string; other servers may not).
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "output"
    return {"type": "json_schema", "json_schema": {"name": safe, "schema": schema,
                                                   "strict": True}}
