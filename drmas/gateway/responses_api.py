"""The Responses API (POST /v1/responses) on the gateway: what agent frameworks send by default.

The OpenAI Agents SDK's default model (`OpenAIResponsesModel`) and LangChain's `use_responses_api=True` call
`/v1/responses` rather than chat completions. A request is decoded here into the same `ChatCall` a chat
completion makes (so it is generated, batched and recorded as one sample of its agent, exactly as a chat call),
and the reply is built as a `response` object whose output items are a message and the function calls the tool
parser found.

What is honoured: `input` (a string, or items: messages with text parts, `function_call` and
`function_call_output`), `instructions` (a system message first), `tools` (function tools) with `tool_choice`
auto, none, required or a named function (`drmas.gateway.structured`), `text.format` text, json_object or
json_schema (decoded under its grammar), `max_output_tokens` (capped by the agent's `max_new_tokens`), `previous_response_id` (the stored
conversation of an earlier response of the same episode; `store: false` stores nothing), `temperature`/`top_p`
under `system.sampling: request`, `stream` (`drmas.gateway.sse`). A reply cut by the token cap is `incomplete`
with `incomplete_details.reason = "max_output_tokens"`, as OpenAI answers. Refused with a clear error: items of
other types (images, files, hosted tools, reasoning, item references), `background`, `conversation`, `prompt`. Unknown fields are ignored.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Optional, Sequence, Union

import msgspec

from drmas.core.tool_calls import ToolGrammar, ToolParser
from drmas.gateway import structured
from drmas.gateway.openai_api import (ApiError, ChatCall, bad_request, check_model, decode, function_tools,
                                      sampling_of, split_calls, tool_call_entry)
from drmas.mas.base import Reply

STORED_RESPONSES = 4096  # responses kept for previous_response_id (oldest forgotten first)
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text"}
_REFUSED = {"background": "background responses", "conversation": "conversations (use previous_response_id)",
            "prompt": "prompt templates"}


class _InputItem(msgspec.Struct):
    type: Optional[str] = None  # "message" when absent (an easy input message)
    role: Optional[str] = None
    content: Union[str, list[dict[str, Any]], None] = None
    call_id: Optional[str] = None
    name: Optional[str] = None
    arguments: Optional[str] = None
    output: Union[str, list[dict[str, Any]], None] = None


class _ToolDef(msgspec.Struct):
    type: str
    name: Optional[str] = None
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ResponsesRequest(msgspec.Struct):
    """The body of POST /v1/responses, as far as the gateway reads it."""

    model: str
    input: Union[str, list[_InputItem]]
    instructions: Optional[str] = None
    tools: Optional[list[_ToolDef]] = None
    tool_choice: Union[str, dict, None] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    previous_response_id: Optional[str] = None
    store: Optional[bool] = None
    stream: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    parallel_tool_calls: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    background: Optional[bool] = None
    conversation: Any = None
    prompt: Any = None


@dataclass(frozen=True)
class ResponsesCall:
    """A checked Responses request: the call to generate, and what the response object echoes."""

    call: ChatCall
    history: list[dict]  # the conversation without the instructions: what a later response continues
    echo: dict  # the request's settings, as the response object repeats them
    store: bool


@dataclass(frozen=True)
class _Stored:
    episode: str
    messages: list[dict]


class ResponseStore:
    """Earlier responses' conversations, for `previous_response_id` (bounded; shared by the server's threads)."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self._items: OrderedDict[str, _Stored] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def put(self, response_id: str, episode: str, messages: list[dict]) -> None:
        with self._lock:
            self._items[response_id] = _Stored(episode, messages)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def conversation(self, response_id: str, episode: str) -> list[dict]:
        with self._lock:
            stored = self._items.get(response_id)
        if stored is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Previous response with id '{response_id}' not found (responses made "
                           f"with store=false are not kept, and only the last {self._capacity} are)",
                           param="previous_response_id", code="previous_response_not_found")
        if stored.episode != episode:
            raise bad_request(f"previous response {response_id} belongs to episode {stored.episode}, not {episode}",
                              "previous_response_id")
        return list(stored.messages)


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def decode_responses(body: bytes, agents: Sequence[str]) -> ResponsesRequest:
    """Decode and check a Responses request (ApiError naming the parameter); `prepare` makes it a call."""
    req = decode(body, ResponsesRequest)
    check_model(req.model, agents)
    for key, what in _REFUSED.items():
        if getattr(req, key):
            raise bad_request(f"{what} are not supported by the drmas gateway ({key})", key, "unsupported_parameter")
    return req


def prepare(req: ResponsesRequest, episode: str, store: ResponseStore, honour_sampling: bool,
            grammar: Optional[ToolGrammar] = None, parser: str = "hermes") -> ResponsesCall:
    """The call of `episode` a decoded request makes: its conversation continues `previous_response_id`'s; a
    forced tool_choice is decoded under `grammar`, the tool call grammar of the run's tool parser `parser`."""
    history = store.conversation(req.previous_response_id, episode) if req.previous_response_id else []
    history += _items(req.input)
    if not history:
        raise bad_request("input must not be empty", "input")
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history
    tools = [(t.type, t.name or "", t.description, t.parameters) for t in req.tools or []]
    sampling = sampling_of(req.max_output_tokens, req.temperature, req.top_p, None, honour_sampling,
                           "max_output_tokens")
    offered = function_tools(tools, req.tool_choice)
    text_format = (req.text or {}).get("format")
    constraint = structured.constraint_of(text_format, "text.format", "", offered, req.tool_choice, grammar, parser,
                                          req.parallel_tool_calls is not False)
    if constraint is not None:
        sampling["constraint"] = constraint
    call = ChatCall(req.model, messages, sampling, (), 1, req.user, offered, bool(req.stream))
    store = req.store is not False
    echo = {"instructions": req.instructions, "tools": [msgspec.to_builtins(t) for t in req.tools or []],
            "tool_choice": req.tool_choice or "auto", "temperature": req.temperature, "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens, "previous_response_id": req.previous_response_id,
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "metadata": req.metadata or {}, "text": {"format": text_format or {"type": "text"}}, "user": req.user,
            "store": store}
    return ResponsesCall(call, history, echo, store)


def _items(given: Union[str, list[_InputItem]]) -> list[dict]:
    """Input items -> chat messages: a function call joins the assistant message before it (or starts one), its
    output becomes a tool message."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    out: list[dict] = []
    for i, item in enumerate(given):
        kind = item.type or "message"
        if kind == "message":
            role = _ROLES.get(item.role or "")
            if role is None:
                raise bad_request(f"input[{i}].role {item.role!r} is not supported by the drmas gateway (roles: "
                                  f"{', '.join(_ROLES)})", "input")
            out.append({"role": role, "content": _text(item.content, f"input[{i}].content")})
        elif kind == "function_call":
            if not item.name or not item.call_id:
                raise bad_request(f"input[{i}]: a function_call needs its name and call_id", "input")
            entry = tool_call_entry(item.call_id, item.name, item.arguments or "", f"input[{i}].arguments", "input")
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(entry)
        elif kind == "function_call_output":
            if not item.call_id:
                raise bad_request(f"input[{i}]: a function_call_output needs the call_id it answers", "input")
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": _text(item.output, f"input[{i}].output")})
        else:
            raise bad_request(f"input[{i}]: items of type {kind!r} are not supported by the drmas gateway (message, "
                              "function_call, function_call_output)", "input", "unsupported_parameter")
    return out


def _text(content: Union[str, list[dict[str, Any]], None], where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_request(f"{where} is missing", "input")
    if any(not isinstance(part.get("text"), str) or part.get("type") not in _TEXT_PARTS for part in content):
        raise bad_request(f"{where}: only text parts are supported by the drmas gateway ({', '.join(sorted(_TEXT_PARTS))})",
                          "input")
    return "".join(part["text"] for part in content)


# ---- replies ------------------------------------------------------------------------------------------------


def response(response_id: str, given: ResponsesCall, reply: Reply, model_id: str,
             tool_parser: Optional[ToolParser]) -> tuple[dict, dict]:
    """The response object of `reply`, and the assistant message it adds to the conversation (stored for a later
    `previous_response_id`)."""
    content, calls = split_calls(reply.text, given.call, tool_parser)
    output: list[dict] = []
    assistant: dict = {"role": "assistant", "content": content}
    incomplete = reply.finish_reason == "length" and not calls
    if content or not calls:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                       "status": "incomplete" if incomplete else "completed",
                       "content": [{"type": "output_text", "text": content, "annotations": [],
                                    "logprobs": []}]})
    for call in calls:
        entry = call.openai()
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": entry["id"],
                       "name": call.name, "arguments": entry["function"]["arguments"], "status": "completed"})
        assistant.setdefault("tool_calls", []).append(
            {"id": entry["id"], "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
    usage = {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
             "total_tokens": reply.prompt_tokens + reply.completion_tokens,
             "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}
    body = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": given.call.agent,
            "status": "incomplete" if incomplete else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "output": output,
            "usage": usage, "truncation": "disabled", "reasoning": None, "background": False,
            "service_tier": "default", "system_fingerprint": f"drmas-{model_id}-v{reply.version}", **given.echo}
    return body, assistant
