"""JSON schemas for the optimizer's and aggregator's replies, built from the parameters.

Sent as `response_format={"type": "json_schema", ...}`, they let a backend constrain
decoding (OpenAI structured outputs, llama.cpp grammars), so even a small model replies
with the right keys and value types. Backends that reject a schema fall back to JSON
mode, then to plain text; the extraction chain reads the reply either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .parameters import Parameter

__all__ = ["parameter_schema", "reply_format"]

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def parameter_schema(param: Parameter) -> dict[str, Any]:
    """The JSON schema of one parameter's values, with its constraint's checkable parts."""
    schema: dict[str, Any] = {"type": _JSON_TYPES[param.type]}
    constraint = param.constraint
    if constraint is None:
        return schema
    if constraint.choices is not None:
        schema["enum"] = list(constraint.choices)
    if constraint.min is not None and param.type in (int, float):
        schema["minimum"] = constraint.min
    if constraint.max is not None and param.type in (int, float):
        schema["maximum"] = constraint.max
    if constraint.max_length is not None:
        lengths: dict[type, str] = {str: "maxLength", list: "maxItems"}
        key = lengths.get(param.type)
        if key:
            schema[key] = constraint.max_length
    return schema


def reply_format(params: Sequence[Parameter], reasoning_keys: Sequence[str], name: str) -> dict[str, Any]:
    """`response_format` asking for `{<reasoning keys>: str, "suggestion": {name: value}}`."""
    trainable = [p for p in params if p.trainable]
    suggestion = {
        "type": "object",
        "properties": {p.name: parameter_schema(p) for p in trainable},
        "required": [p.name for p in trainable],
    }
    properties: dict[str, Any] = {key: {"type": "string", "maxLength": 1000} for key in reasoning_keys}
    properties["suggestion"] = suggestion
    return {
        "type": "json_schema",
        "json_schema": {
            "name": name,
            "schema": {"type": "object", "properties": properties, "required": [*reasoning_keys, "suggestion"]},
            "strict": False,
        },
    }
