"""Tool calling in chat turns: the tools a turn offers rendered into its prompt, the calls a reply makes parsed out.

Agents written for an agent framework (LangGraph, the OpenAI Agents SDK, AutoGen, ...) call tools through the
chat API: a request lists `tools` (OpenAI's function definitions), the model answers with `tool_calls`, and the
next request carries the assistant's calls and one `tool` message per result. An LLM sees none of that
structure, only text: the chat template writes the tool definitions into the prompt and the model writes its
calls in a format the template taught it. So drmas does two things, on either side of the engine:

* `prompt_ids`: a turn's prompt, `tokenizer.apply_chat_template(messages, tools=...)`. A model whose template
  knows tools (Qwen2.5/3, Hermes, SmolLM3, ...) gets them as it was trained to. A template that does not
  mention tools would drop them silently; drmas then writes them itself in the Hermes format (a system block
  listing the functions as JSON and asking for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), and
  folds earlier calls and results into text the template can render.
* a tool-call parser (registry `TOOL_PARSERS`, `system.tool_parser` of the external system): the reply's text
  -> its content and its calls. Built in: `hermes`, the format of the templates above and of the fallback.
* for a forced call (`tool_choice` required or a named function), the grammar of that parser's format
  (registry `TOOL_CALL_GRAMMARS`, under the parser's name): the engine then decodes only such calls.

Training is untouched by either: a sample's prompt is the rendered ids and its response the tokens the engine
sampled, call syntax included, so a malformed call is the model's own mistake to be rewarded as the program
sees fit (it may report the call in `invalid_calls`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from drmas.core.constraints import Constraint
from drmas.core.registry import Registry


@dataclass(frozen=True)
class ParsedCall:
    """One tool call found in a reply: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict

    def openai(self) -> dict:
        """As OpenAI's `tool_calls` entry (arguments as a JSON string, a fresh call id)."""
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


ToolParser = Callable[[str], "tuple[str, list[ParsedCall]]"]  # reply text -> (content, calls)
TOOL_PARSERS: Registry[ToolParser] = Registry("tool parser")

# (offered tools as OpenAI's function tools, tool_choice "required" or {"type": "function", "function": {"name"}},
# parallel_tool_calls) -> the constraint under which the reply is only such calls
ToolGrammar = Callable[[Sequence[dict], Any, bool], Constraint]
TOOL_CALL_GRAMMARS: Registry[ToolGrammar] = Registry("tool call grammar")

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> tuple[str, list[ParsedCall]]:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (several allowed) -> calls; the text
    around them is the content. A block that is not such a JSON object stays in the content as the model wrote
    it (OpenAI-compatible servers do the same), so the program sees the attempt and no call."""
    calls: list[ParsedCall] = []
    kept: list[str] = []
    end = 0
    for match in _HERMES_CALL.finditer(text):
        call = _call_of(match.group(1))
        if call is None:
            continue
        kept.append(text[end:match.start()])
        calls.append(call)
        end = match.end()
    kept.append(text[end:])
    return "".join(kept).strip() if calls else text, calls


@TOOL_CALL_GRAMMARS.register("hermes")
def hermes_calls(tools: Sequence[dict], choice: Any, parallel: bool) -> Constraint:
    """Only `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks of the offered functions (or of
    the named one), their arguments following each function's schema: xgrammar's structural tag of the Qwen 3
    format, which is Hermes' (reasoning blocks left out)."""
    from xgrammar import get_model_structural_tag

    tag = get_model_structural_tag("qwen_3", tools=[dict(t) for t in tools], tool_choice=choice, reasoning="disabled",
                                   parallel_tool_calls=parallel, max_whitespace_cnt=1)
    return Constraint("structural_tag", tag.model_dump_json())


def _call_of(body: str) -> Optional[ParsedCall]:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as the API sends them
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return ParsedCall(value["name"], arguments) if isinstance(arguments, dict) else None


# ---- prompts ------------------------------------------------------------------------------------------------


def prompt_ids(tokenizer: Any, messages: Sequence[Mapping], tools: Optional[Sequence[Mapping]] = None) -> list[int]:
    """The token ids of a turn's prompt: its messages (and tools) through the chat template, with the
    generation prompt. Messages may hold assistant `tool_calls` (arguments as objects) and `tool` results."""
    kwargs: dict = {}
    if tools or _has_tool_messages(messages):
        if knows_tools(tokenizer):
            kwargs["tools"] = list(tools) if tools else None
        else:
            messages = hermes_fallback(messages, tools or ())
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, **kwargs)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def knows_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tool definitions (it names `tools`)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and "tools" in template


def _has_tool_messages(messages: Sequence[Mapping]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


_FALLBACK_HEAD = ("You may call one or more functions to help with the request. The functions, as JSON "
                  "schemas:\n<tools>\n{tools}\n</tools>\nTo call a function, write one block per call:\n"
                  '<tool_call>\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n</tool_call>\n'
                  "Each result comes back in a <tool_response> block.")


def hermes_fallback(messages: Sequence[Mapping], tools: Sequence[Mapping]) -> list[dict]:
    """`messages` for a template that knows no tools: the tool definitions in the system message (Hermes
    format), earlier calls written into the assistant's content as `<tool_call>` blocks, results as user
    messages holding `<tool_response>` blocks."""
    out: list[dict] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            blocks = [_call_block(call) for call in message["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(([content] if content else []) + blocks)})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        head = _FALLBACK_HEAD.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{head}"}
        else:
            out.insert(0, {"role": "system", "content": head})
    return out


def _call_block(call: Mapping) -> str:
    function = call.get("function", call)
    return "<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": function.get("arguments", {})},
                                        ensure_ascii=False) + "\n</tool_call>"
