"""The wire format of the gateway: OpenAI chat completions and models, and drmas' episode endpoints.

Requests are decoded strictly (msgspec) and checked here, replies built here, and every refusal is an
`ApiError`, which the app answers with OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`,
and the status an OpenAI client expects (400 bad request, 401 bad key, 404 unknown model or episode, 410 an
episode that has ended or was dropped, 413 body too large, 503 nothing to hand out / stopping). No sockets
here (`drmas.gateway.app`), no episode state (`drmas.gateway.inbox`).

What a chat completion honours: `messages` (system, developer = system, user, assistant, tool; text content, as
a string or text parts; an assistant's `tool_calls`), `tools` (function definitions, rendered by the chat
template, `drmas.core.tool_calls`) with `tool_choice` auto or none, `max_tokens` / `max_completion_tokens`
(capped by the agent's `max_new_tokens`), `stop` (up to 4 strings; cut from the returned content, as OpenAI
does), `n` (up to `MAX_N` choices, each a sample); `temperature`, `top_p` and `seed` only with `system.sampling:
request` (by default the agent's configured sampling decides, so training explores and evaluation samples as
configured). A reply's tool calls are parsed by `system.tool_parser` into the message's `tool_calls` (finish
reason `tool_calls`). `stream: true` is answered as server-sent chunks (`drmas.gateway.sse`); `response_format`
json_schema / json_object and a forced `tool_choice` (required or a named function) are decoded under a grammar
(`drmas.gateway.structured`). Refused with a clear error: the legacy `functions`, `logprobs`, non-zero penalties,
`logit_bias`, non-text content. Unknown fields are ignored, as OpenAI-compatible servers do. The Responses API's
requests are decoded in `drmas.gateway.responses_api` into the same `ChatCall`, with the helpers here.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Optional, Sequence, Union

import msgspec

from drmas.core.sample import STORABLE, storable
from drmas.core.tool_calls import ParsedCall, ToolGrammar, ToolParser
from drmas.gateway import structured
from drmas.gateway.errors import ApiError, bad_request
from drmas.mas.base import Reply

MAX_N = 8  # choices per call: each is a sample, generated one after another (see docs/gateway.md)
MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_STOP_CHARS = 256
MAX_TOOLS = 128
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_UNSUPPORTED = {  # request field -> why it is refused when set
    "functions": "the legacy function calling (use tools)", "function_call": "the legacy function calling (use tools)",
    "logit_bias": "logit_bias", "audio": "audio output", "prediction": "predicted outputs",
}


# ---- requests -----------------------------------------------------------------------------------------------


class _Part(msgspec.Struct):
    type: str
    text: Optional[str] = None


class _Function(msgspec.Struct):
    name: str
    arguments: str = "{}"  # a JSON object, as a string (as the API sends it)


class _ToolCall(msgspec.Struct):
    function: _Function
    id: Optional[str] = None
    type: str = "function"


class _Message(msgspec.Struct):
    role: str
    content: Union[str, list[_Part], None] = None
    tool_calls: Optional[list[_ToolCall]] = None  # an assistant's
    tool_call_id: Optional[str] = None  # a tool result's
    name: Optional[str] = None


class _FunctionDef(msgspec.Struct):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class _Tool(msgspec.Struct):
    function: _FunctionDef
    type: str = "function"


class ChatRequest(msgspec.Struct):
    """The body of POST /v1/chat/completions, as far as the gateway reads it."""

    model: str
    messages: list[_Message]
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    stop: Union[str, list[str], None] = None
    n: Optional[int] = None
    seed: Optional[int] = None
    user: Optional[str] = None
    stream: Optional[bool] = None
    stream_options: Optional[dict[str, Any]] = None
    logprobs: Optional[bool] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    response_format: Any = None
    tools: Optional[list[_Tool]] = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Any = None
    function_call: Any = None
    logit_bias: Any = None
    audio: Any = None
    prediction: Any = None


@dataclass(frozen=True)
class ChatCall:
    """A checked chat completion request: what the episode's agent turn is made of."""

    agent: str
    messages: list[dict]
    sampling: dict  # `AgentTurn.sampling`: max_new_tokens, stop, and with sampling=request temperature/top_p/seed
    stop: tuple[str, ...]  # the request's own stop strings, cut from the returned content
    n: int
    user: Optional[str]
    tools: Optional[list[dict]] = None  # OpenAI's function definitions, for the chat template
    stream: bool = False  # answer as server-sent events (the reply is generated and recorded whole all the same)
    stream_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


class RewardRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of POST /drmas/v1/episodes/{id}/reward: the episode's reward, or its final answer for drmas to
    grade with the task, and optionally rewards per agent (by name) or per call (by completion id), and the calls
    whose reply had the wrong format (by completion id: they draw `algorithm.invalid_penalty`, as the invalid
    turns of a built-in system do)."""

    reward: Optional[float] = None
    answer: Optional[str] = None
    agent_rewards: Optional[dict[str, float]] = None
    call_rewards: Optional[dict[str, float]] = None
    invalid_calls: Optional[list[str]] = None


class _ClaimRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of POST /drmas/v1/episodes: empty, or `{}` (nothing to choose yet)."""


def decode_chat(body: bytes, agents: Sequence[str], honour_sampling: bool, grammar: Optional[ToolGrammar] = None,
                parser: str = "hermes") -> ChatCall:
    """Decode and check a chat completion request (ApiError naming the parameter); `grammar`: the tool call grammar
    of the run's tool parser `parser`, for a forced tool_choice."""
    req = decode(body, ChatRequest)
    check_model(req.model, agents)
    for key, what in _UNSUPPORTED.items():
        if getattr(req, key) not in (None, [], {}):
            raise bad_request(f"{what} is not supported by the drmas gateway ({key})", key, "unsupported_parameter")
    if req.logprobs:
        raise bad_request("logprobs are not returned by the drmas gateway (drmas records them itself)", "logprobs",
                          "unsupported_parameter")
    for key in ("frequency_penalty", "presence_penalty"):
        if getattr(req, key):
            raise bad_request(f"{key} is not supported by the drmas gateway (only 0)", key, "unsupported_parameter")
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n must be 1 to {MAX_N}, got {n}", "n")
    stop = _stop_strings(req.stop)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sampling = sampling_of(max_tokens, req.temperature, req.top_p, req.seed, honour_sampling, "max_tokens")
    if stop:
        sampling["stop"] = stop
    tools = function_tools([(t.type, t.function.name, t.function.description, t.function.parameters)
                            for t in req.tools or []], req.tool_choice)
    constraint = structured.constraint_of(req.response_format, "response_format", "json_schema", tools,
                                          req.tool_choice, grammar, parser, req.parallel_tool_calls is not False)
    if constraint is not None:
        sampling["constraint"] = constraint
    usage = bool(req.stream and (req.stream_options or {}).get("include_usage"))
    return ChatCall(req.model, _messages(req.messages), sampling, stop, n, req.user, tools, bool(req.stream), usage)


def check_model(model: str, agents: Sequence[str]) -> None:
    if model not in agents:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist: the models are this run's "
                       f"agents ({', '.join(agents)})", param="model", code="model_not_found")


def sampling_of(max_tokens: Optional[int], temperature: Optional[float], top_p: Optional[float],
                seed: Optional[int], honour_sampling: bool, max_tokens_param: str) -> dict:
    """`AgentTurn.sampling` of a request: its token cap, and its temperature, top_p and seed where the run honours
    them (system.sampling: request); each checked against OpenAI's ranges."""
    sampling: dict = {}
    if max_tokens is not None:
        if max_tokens < 1:
            raise bad_request(f"{max_tokens_param} must be >= 1, got {max_tokens}", max_tokens_param)
        sampling["max_new_tokens"] = max_tokens  # capped by the agent's max_new_tokens where it is applied
    if temperature is not None and not (math.isfinite(temperature) and 0 <= temperature <= 2):
        raise bad_request(f"temperature must be 0 to 2, got {temperature}", "temperature")
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise bad_request(f"top_p must be > 0 and <= 1, got {top_p}", "top_p")
    if honour_sampling:
        sampling.update({k: v for k, v in (("temperature", temperature), ("top_p", top_p)) if v is not None})
        if seed is not None:
            sampling["seed"] = seed % 2**63
    return sampling


def decode_reward(body: bytes) -> RewardRequest:
    req = decode(body, RewardRequest)
    if req.reward is None and req.answer is None:
        raise bad_request("give the episode's `reward`, or its final `answer` for drmas to grade with the task",
                          "reward")
    numbers = [("reward", req.reward)] + [(f"agent_rewards.{k}", v) for k, v in (req.agent_rewards or {}).items()]
    numbers += [(f"call_rewards.{k}", v) for k, v in (req.call_rewards or {}).items()]
    for key, value in numbers:
        if value is not None and not storable(value):
            raise bad_request(f"{key} must be {STORABLE}, got {value}", key.split(".")[0])
    return req


def decode_claim(body: bytes) -> None:
    if body.strip():
        decode(body, _ClaimRequest)


def decode(body: bytes, kind: type) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        found = re.search(r"at `\$\.([A-Za-z_]+)", str(exc)) or re.search(r"field `([A-Za-z_]+)`", str(exc))
        raise bad_request(f"invalid request: {exc}", found.group(1) if found else None) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None


def _stop_strings(stop: Union[str, list[str], None]) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > MAX_STOP:
        raise bad_request(f"at most {MAX_STOP} stop strings, got {len(strings)}", "stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in strings):
        raise bad_request(f"stop strings must be 1 to {MAX_STOP_CHARS} characters", "stop")
    return tuple(dict.fromkeys(strings))


def function_tools(tools: Sequence[tuple[str, str, Optional[str], Optional[dict]]],
                   choice: Union[str, dict, None]) -> Optional[list[dict]]:
    """A request's function definitions, (type, name, description, parameters) each, as the chat template takes
    them (None: none, or tool_choice none; a forcing tool_choice is `drmas.gateway.structured`'s)."""
    if not tools or choice == "none":
        return None
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
    out = []
    for i, (kind, name, description, parameters) in enumerate(tools):
        if kind != "function" or not name:
            raise bad_request(f"tools[{i}]: only function tools with a name are supported", "tools")
        function = {"name": name, "description": description or "",
                    "parameters": parameters or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": function})
    return out


def _messages(messages: list[_Message]) -> list[dict]:
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    out = []
    for i, message in enumerate(messages):
        role = ROLES.get(message.role)
        if role is None:
            raise bad_request(f"messages[{i}].role {message.role!r} is not supported by the drmas gateway (roles: "
                              f"{', '.join(ROLES)})", "messages")
        calls = message.tool_calls if role == "assistant" else None
        entry: dict = {"role": role, "content": "" if calls and message.content is None else _text(message.content, i)}
        if calls:
            entry["tool_calls"] = [_call(call, i, j) for j, call in enumerate(calls)]
        if role == "tool":
            entry["tool_call_id"] = message.tool_call_id or ""
            if message.name:
                entry["name"] = message.name
        out.append(entry)
    return out


def _call(call: _ToolCall, i: int, j: int) -> dict:
    return tool_call_entry(call.id or "", call.function.name, call.function.arguments,
                           f"messages[{i}].tool_calls[{j}].function.arguments", "messages")


def tool_call_entry(call_id: str, name: str, arguments: str, where: str, param: str) -> dict:
    """An assistant's earlier tool call as chat templates take it (arguments as an object)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise bad_request(f"{where} is not JSON: {exc}", param) from None
    if not isinstance(parsed, dict):
        raise bad_request(f"{where} must be a JSON object", param)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def _text(content: Union[str, list[_Part], None], i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_request(f"messages[{i}].content is missing (only an assistant message with tool_calls may go "
                          "without)", "messages")
    if any(part.type != "text" or part.text is None for part in content):
        raise bad_request(f"messages[{i}].content: only text parts are supported by the drmas gateway", "messages")
    return "".join(part.text for part in content)  # type: ignore[misc]


# ---- replies ------------------------------------------------------------------------------------------------


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion(completion_id: str, call: ChatCall, replies: Sequence[Reply], model_id: str,
               tool_parser: Optional[ToolParser] = None) -> dict:
    """The chat.completion object of `replies` (one per choice); `system_fingerprint` names the weights. With
    tools offered, each reply's calls are parsed out by `tool_parser` into the message's `tool_calls`."""
    choices = [_choice(i, reply, call, tool_parser) for i, reply in enumerate(replies)]
    prompt = replies[0].prompt_tokens if replies else 0
    generated = sum(reply.completion_tokens for reply in replies)
    return {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": call.agent,
        "system_fingerprint": f"drmas-{model_id}-v{max((r.version for r in replies), default=0)}",
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
    }


def _choice(index: int, reply: Reply, call: ChatCall, tool_parser: Optional[ToolParser]) -> dict:
    """One choice; with tools offered, the reply's calls in `tool_calls` and the finish reason `tool_calls`."""
    text = cut_at_stop(reply.text, call.stop)
    content, calls = split_calls(text, call, tool_parser)
    if not calls:
        message = {"role": "assistant", "content": text}
    else:
        message = {"role": "assistant", "content": content or None, "tool_calls": [c.openai() for c in calls]}
    return {"index": index, "message": message, "finish_reason": "tool_calls" if calls else reply.finish_reason,
            "logprobs": None}


def split_calls(text: str, call: ChatCall, tool_parser: Optional[ToolParser]) -> tuple[str, list[ParsedCall]]:
    """A reply's content and tool calls: parsed when the call offered tools, else all content."""
    return tool_parser(text) if call.tools and tool_parser is not None else (text, [])


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """The content up to the first of the request's stop strings (OpenAI leaves them out; drmas trains on them)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def models(agents: Sequence[str]) -> dict:
    return {"object": "list", "data": [model(agent) for agent in agents]}


def model(agent: str) -> dict:
    return {"id": agent, "object": "model", "created": 0, "owned_by": "drmas"}
