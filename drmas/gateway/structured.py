"""Structured output and forced tool calls on the gateway: the `Constraint` a request's sampling carries.

A request asking for JSON (chat's `response_format`, the Responses API's `text.format`: `json_schema` with its
schema, or `json_object`) or forcing a tool call (`tool_choice` `required`, or one named function) is generated
under a grammar (constrained decoding: `drmas.core.constraints`, `drmas.engines.grammar`), so the reply is what
the program's parser expects. A forced call is decoded in the format of the run's tool parser, by the grammar
registered for it (`drmas.core.tool_calls.TOOL_CALL_GRAMMARS`), and parsed back into `tool_calls` as any call is.
"""

from __future__ import annotations

from typing import Any, Optional

from drmas.core.constraints import Constraint
from drmas.core.tool_calls import ToolGrammar
from drmas.gateway.errors import bad_request


def constraint_of(fmt: Any, param: str, schema_of: str, tools: Optional[list[dict]], choice: Any,
                  grammar: Optional[ToolGrammar], parser: str, parallel: bool) -> Optional[Constraint]:
    """The one constraint of a request: its output format's (`output_format`) or its forced tool calls'
    (`forced_calls`), not both (None: neither)."""
    output = output_format(fmt, param, schema_of)
    calls = forced_calls(tools, choice, grammar, parser, parallel)
    if output is not None and calls is not None:
        raise bad_request("a forced tool_choice and a JSON output format cannot both constrain one reply",
                          "tool_choice")
    return output or calls


def output_format(fmt: Any, param: str, schema_of: str) -> Optional[Constraint]:
    """The constraint of a requested output format (None: plain text). `schema_of`: where the format keeps its
    schema (`json_schema` for chat's response_format; "" for the Responses API's text.format, flat)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type", "text") not in ("text", "json_object", "json_schema"):
        raise bad_request(f"{param}: type must be text, json_object or json_schema, got {fmt!r}", param,
                          "unsupported_parameter")
    if fmt.get("type", "text") == "text":
        return None
    if fmt["type"] == "json_object":
        return Constraint.json_object()
    holder = fmt.get(schema_of) if schema_of else fmt
    schema = holder.get("schema") if isinstance(holder, dict) else None
    if not isinstance(schema, dict):
        where = f"{param}.{schema_of}.schema" if schema_of else f"{param}.schema"
        raise bad_request(f"{where} must be a JSON schema (an object)", param)
    return Constraint.json_schema(schema)


def forced_calls(tools: Optional[list[dict]], choice: Any, grammar: Optional[ToolGrammar], parser: str,
                 parallel: bool) -> Optional[Constraint]:
    """The constraint of a forced tool choice over the request's function `tools` (None: the choice forces
    nothing)."""
    if choice in (None, "auto", "none"):
        return None
    named = _named(choice)
    if choice != "required" and named is None:
        raise bad_request(f"tool_choice must be none, auto, required or a function, got {choice!r}", "tool_choice")
    if not tools:
        raise bad_request(f"tool_choice {choice!r} needs tools to call", "tool_choice")
    if named is not None and named not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice names the function {named!r}, which is not among the tools", "tool_choice")
    if grammar is None:
        raise bad_request(f"tool_choice {choice!r} needs a grammar for the tool parser {parser!r} (register one in "
                          "drmas.api.TOOL_CALL_GRAMMARS under its name)", "tool_choice", "unsupported_parameter")
    forced: Any = "required" if named is None else {"type": "function", "function": {"name": named}}
    try:
        return grammar(tools, forced, parallel)
    except (ValueError, TypeError, KeyError) as exc:
        raise bad_request(f"tool_choice {choice!r}: the tools give no grammar: {exc}", "tools") from None


def _named(choice: Any) -> Optional[str]:
    """The function a tool_choice names (chat: {"type": "function", "function": {"name"}}; responses: flat)."""
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    name = (choice.get("function") or {}).get("name") if "function" in choice else choice.get("name")
    return name if isinstance(name, str) and name else None
