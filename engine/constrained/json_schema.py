"""JSON schemas as the grammar sees them: the rewrite every schema gets before compiling, and the
keywords the grammar engine would silently ignore. Plain Python (no torch, no xgrammar), so the
gateway can check a request's schema before it writes anything.

What xgrammar 0.2.9 does with a schema keyword falls in three groups (checked by compiling schemas
and matching strings against them):
- enforced: type, properties, required, additionalProperties, unevaluatedProperties, items,
  prefixItems, min/maxItems, enum, const, anyOf, one-element allOf, local $ref/$defs, minimum,
  maximum, exclusive bounds, integer multipleOf, pattern, min/maxLength (rewritten below),
  min/maxProperties, the formats it knows (date-time, email, uuid, ...);
- refused with an error at compile time: a regex backreference in `pattern`, a non-integer bound
  on an integer, draft-4 tuple `items`, a `$ref` that resolves nowhere, ...;
- ignored (the output could then fail the schema): the keywords `unsupported_feature` names.
  Those are refused before compiling, so constrained output always validates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

# Whitespace runs inside constrained JSON are capped: a small model left free to emit whitespace
# can spend its whole token budget on it.
MAX_JSON_WHITESPACE: Final[int] = 2

# Keywords whose values are data, not subschemas: never rewritten, never walked.
_DATA_KEYWORDS: Final[frozenset[str]] = frozenset({"enum", "const", "default", "examples"})
_SCHEMA_MAPS: Final[frozenset[str]] = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_LISTS: Final[frozenset[str]] = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_VALUES: Final[frozenset[str]] = frozenset(
    {"items", "additionalProperties", "unevaluatedProperties", "additionalItems",
     "unevaluatedItems", "not", "if", "then", "else", "contains", "propertyNames"})
# Keyword -> what it does, for the message of a refused schema.
_IGNORED: Final[dict[str, str]] = {
    "not": "negation", "if": "conditional subschemas", "then": "conditional subschemas",
    "else": "conditional subschemas", "dependentRequired": "dependent properties",
    "dependentSchemas": "dependent subschemas", "dependencies": "dependent properties",
    "contains": "array containment", "minContains": "array containment",
    "maxContains": "array containment", "propertyNames": "property-name schemas",
    "$dynamicRef": "dynamic references", "$recursiveRef": "recursive references"}
_LOOKAROUND: Final[tuple[str, ...]] = ("(?=", "(?!", "(?<=", "(?<!")


def bounded_strings_as_patterns(node: Any) -> Any:
    """A copy of a schema where each length-bounded plain string schema is a pattern of
    characters that need no JSON escape. Why: xgrammar 0.2.9 compiles a string with
    minLength/maxLength to a character class that admits raw control characters (invalid JSON)
    and no escapes; as a pattern it is exact."""
    if isinstance(node, list):
        return [bounded_strings_as_patterns(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _DATA_KEYWORDS else bounded_strings_as_patterns(v)
           for k, v in node.items()}
    bounded = "minLength" in out or "maxLength" in out
    if (out.get("type") == "string" and bounded
            and not {"enum", "const", "pattern", "format"} & out.keys()):
        low, high = int(out.pop("minLength", 0)), out.pop("maxLength", None)
        upper = "" if high is None else str(int(high))
        out["pattern"] = r'^[^"\\\x00-\x1f]{' + f"{low},{upper}}}$"
    return out


def unsupported_feature(schema: Any) -> str | None:
    """What the grammar engine would ignore in `schema` (a JSON schema), named with where it is
    (a JSON pointer such as `#/properties/tags`), e.g. "the keyword 'not' (negation) at
    #/properties/a"; None when every keyword is enforced or refused at compile time. Pure."""
    for path, node in _subschemas(schema, "#"):
        problem = _node_problem(node)
        if problem is not None:
            return f"{problem} at {path}"
    return None


def _node_problem(node: dict[str, Any]) -> str | None:
    for keyword, what in _IGNORED.items():
        if keyword in node:
            return f"the keyword {keyword!r} ({what})"
    if node.get("uniqueItems") is True:
        return "the keyword 'uniqueItems' (unique array items)"
    if "multipleOf" in node and not (node.get("type") == "integer"
                                     and isinstance(node["multipleOf"], int)):
        return "the keyword 'multipleOf' on a non-integer (only integer steps of integers)"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "the keyword 'allOf' with more than one subschema (only one)"
    if (isinstance(node.get("oneOf"), list) and len(node["oneOf"]) > 1
            and "discriminator" not in node):
        return ("the keyword 'oneOf' without a 'discriminator' (branches that may overlap; "
                "use 'anyOf')")
    ref = node.get("$ref")
    if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
        return f"the reference {ref!r} (only local references '#/...')"
    patterns = [node.get("pattern")] + list(node.get("patternProperties") or {})
    if any(isinstance(p, str) and any(s in p for s in _LOOKAROUND) for p in patterns):
        return "a lookaround assertion in a regular expression"
    return None


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, schema) of `node` and of every schema inside it, depth first."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key, value in node.items():
        where = f"{path}/{_escape(key)}"
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from _subschemas(sub, f"{where}/{_escape(str(name))}")
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _subschemas(sub, f"{where}/{i}")
        elif key in _SCHEMA_VALUES:
            yield from _subschemas(value, where)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
