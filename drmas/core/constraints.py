"""What a response must be: the constraint an engine decodes under (constrained decoding).

A `Constraint` names a grammar in a form every engine's backend takes: `json_schema` (the schema as JSON text;
any JSON object is the schema `{"type": "object"}`, `Constraint.json_object()`) or `structural_tag` (an xgrammar
structural tag as JSON text: text framed by tags whose content follows a schema, what a forced tool call is; vLLM
takes the same). The gateway makes them from
a request's `response_format` / `text.format` and a forced `tool_choice` (`drmas.core.tool_calls`); the embedded
engine compiles them with xgrammar (`drmas.engines.grammar`), vLLM with its structured outputs.

Tokens are sampled from the model's distribution restricted to what the grammar allows next, renormalised; the
behaviour log-prob recorded for each token is under that constrained distribution (docs/gateway.md says what
that means for the loss).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "structural_tag")


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of KINDS
    spec: str  # the schema or structural tag, as JSON text

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r} (kinds: {', '.join(KINDS)})")

    @staticmethod
    def json_schema(schema: dict[str, Any]) -> "Constraint":
        return Constraint("json_schema", json.dumps(schema))  # key order kept: it is the order written

    @staticmethod
    def json_object() -> "Constraint":
        return Constraint.json_schema({"type": "object"})
