"""Tool calling in chat turns (drmas.core.tool_calls): the Hermes parser on the forms models write, and prompts
rendered by real chat templates, one that knows tools (they reach the template's own rendering) and one that does
not (drmas writes them in the Hermes format). The gateway's round trip through the openai client:
tests/test_gateway.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from drmas import assembly
from drmas.config import ConfigError
from drmas.engines.embedded import EmbeddedEngine
from drmas.mas.base import AgentTurn
from drmas.core.tool_calls import TOOL_PARSERS, ParsedCall, knows_tools, parse_hermes, prompt_ids
from drmas.episodes.submission import encode

TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
HISTORY = [{"role": "user", "content": "2 + 3?"},
           {"role": "assistant", "content": "", "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "5"}]
TOOLS_TEMPLATE = (  # a template that renders tools itself, as Qwen's and Hermes' do (in its own words)
    "{% if tools %}FUNCTIONS {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}"
    "{% for c in m.tool_calls or [] %} CALLS {{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', "", [("add", {"a": 2, "b": 3})]),
    ('Let me add.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> and <tool_call>{"name": "neg", '
     '"parameters": {"x": 4}}</tool_call>', "Let me add. and", [("add", {"a": 1}), ("neg", {"x": 4})]),
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 7}"}</tool_call>', "", [("add", {"a": 7})]),
    ('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>', None, []),  # cut short: stays text
    ('<tool_call>["add"]</tool_call>', None, []),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', None, []),
    ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', None, []),
    ("The answer is \\boxed{5}.", None, []),
    ('<tool_call>{"name": "add"}</tool_call> then <tool_call>oops</tool_call>', "then <tool_call>oops</tool_call>",
     [("add", {})]),
])
def test_hermes_parser_finds_well_formed_calls_and_leaves_the_rest_as_text(text, content, calls):
    got_content, got = parse_hermes(text)
    assert [(c.name, c.arguments) for c in got] == calls
    assert got_content == (text if content is None else content)
    assert TOOL_PARSERS.get("hermes") is parse_hermes


def test_a_parsed_call_is_an_openai_tool_call():
    entry = ParsedCall("add", {"a": 2, "text": "é"}).openai()
    assert entry["type"] == "function" and entry["id"].startswith("call_")
    assert entry["function"]["name"] == "add" and json.loads(entry["function"]["arguments"]) == {"a": 2, "text": "é"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_template_without_tools_gets_them_in_the_hermes_format(tokenizer):
    assert not knows_tools(tokenizer)  # SmolLM2's template (the tiny models' tokenizer)
    prompt = tokenizer.decode(prompt_ids(tokenizer, HISTORY, [TOOL]))
    assert "<tools>\n" + json.dumps(TOOL) + "\n</tools>" in prompt  # in the system message, before the user's
    assert prompt.index("<tools>") < prompt.index("2 + 3?")
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in prompt
    assert "<tool_response>\n5\n</tool_response>" in prompt
    system = [{"role": "system", "content": "You are terse."}, *HISTORY]
    with_system = tokenizer.decode(prompt_ids(tokenizer, system, [TOOL]))
    assert with_system.count("<|im_start|>system") == 1 and "You are terse.\n\nYou may call" in with_system
    plain = [{"role": "user", "content": "2 + 3?"}]
    assert prompt_ids(tokenizer, plain) == prompt_ids(tokenizer, plain, []) == tokenizer(
        tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )["input_ids"]


def test_a_template_that_knows_tools_renders_them_itself(tokenizer):
    own = copy.deepcopy(tokenizer)
    own.chat_template = TOOLS_TEMPLATE
    assert knows_tools(own)
    prompt = own.decode(prompt_ids(own, HISTORY, [TOOL]))
    assert prompt.startswith("FUNCTIONS [{") and '"name": "add"' in prompt and "<tools>" not in prompt
    assert 'CALLS add{"a": 2, "b": 3}' in prompt and "[tool] 5" in prompt and prompt.endswith("[assistant]")


def test_the_runner_renders_a_turns_tools(tiny_model):
    """What the episode runner encodes for an AgentTurn with tools (the engines get these ids)."""
    model, tokenizer = tiny_model
    engine = EmbeddedEngine("m", model, tokenizer, seed=0)
    turn = AgentTurn("solver", HISTORY, tools=[TOOL])
    assert encode(engine, turn) == prompt_ids(tokenizer, HISTORY, [TOOL])
    assert encode(engine, AgentTurn("solver", HISTORY[:1])) != prompt_ids(tokenizer, HISTORY[:1], [TOOL])


def test_an_unknown_tool_parser_is_a_config_error_naming_the_key():
    config = Path(__file__).resolve().parents[1] / "examples" / "openai_agents" / "config.yaml"
    with pytest.raises(ConfigError, match=r"system.tool_parser: 'hermez' is not a registered tool parser.*hermes"):
        assembly.load_config(config, ["system.tool_parser=hermez"])
