"""The gateway's Responses API (POST /v1/responses) and streaming (`stream: true`), driven by the real `openai`
client: a Responses call is generated and recorded as one sample of its agent like a chat completion;
`previous_response_id` continues a conversation within its episode; streamed answers carry the same reply, in
OpenAI's chunk and event formats, read back by the client's own stream helpers; bad requests get OpenAI's error
objects. Agent frameworks on their defaults: tests/test_agent_frameworks.py."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from drmas.core.tool_calls import parse_hermes
from drmas.gateway import openai_api as api
from drmas.gateway import responses_api, sse
from drmas.mas.base import Reply

from gateway_harness import IDLE, ask, claim, config_of, end, engine, requests_of, run_program, runner_of  # noqa: F401
from pipeline_harness import smoke_model  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_responses_calls_are_recorded_as_samples_and_continue_a_conversation(engine):
    """client.responses.create through the gateway: the response's output text and usage are the recorded sample's;
    `instructions` is the prompt's system message; a call with previous_response_id sees the earlier input and reply
    (and the new input) in its prompt, only within its episode; store=false stores nothing; a function call and its
    output given back as input items reach the prompt as the chat template writes them."""
    seen: dict = {}

    def program(url: str, token: str) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
        eid = claim(url, token)["id"]
        other = claim(url, token)["id"]
        first = client.responses.create(model="solver", instructions="Answer in a box.", input="What is 2 + 3?",
                                        max_output_tokens=4, user=eid)
        second = client.responses.create(model="verifier", input="Is that right?", previous_response_id=first.id,
                                         max_output_tokens=3, extra_headers={"X-Drmas-Episode": eid})
        loose = client.responses.create(model="solver", input="Once.", store=False, max_output_tokens=2, user=eid)
        tools = client.responses.create(model="solver", user=eid, max_output_tokens=2, tools=[WEATHER], input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "light snow, -3 C"}])
        with pytest.raises(openai.BadRequestError, match="belongs to episode"):
            client.responses.create(model="solver", input="x", previous_response_id=first.id, user=other)
        for kwargs, error in ((dict(previous_response_id=loose.id), openai.NotFoundError),
                              (dict(previous_response_id="resp_nope"), openai.NotFoundError),
                              (dict(model="planner"), openai.NotFoundError),
                              (dict(input=[{"type": "input_image", "image_url": "x"}]), openai.BadRequestError),
                              (dict(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
                               openai.BadRequestError),
                              (dict(input=[{"type": "function_call", "name": "f", "call_id": "c",
                                            "arguments": "{no"}]), openai.BadRequestError),
                              (dict(max_output_tokens=0), openai.BadRequestError),
                              (dict(background=True), openai.BadRequestError)):
            with pytest.raises(error) as caught:
                client.responses.create(**{"model": "solver", "input": "x", "user": eid, **kwargs})
            assert set(caught.value.body) == {"message", "type", "param", "code"}, kwargs
        with pytest.raises(openai.BadRequestError, match="name the episode"):
            client.responses.create(model="solver", input="x")
        seen.update(first=first, second=second, tools=tools)
        assert end(url, eid, {"reward": 1.0, "call_rewards": {first.id: 0.5}}).status_code == 200
        assert end(url, other, {"reward": 0.0}).status_code == 400  # made no call: it stays open, then is dropped

    cfg = config_of("system.command=" + json.dumps(IDLE), "system.episode_timeout_s=10")
    result, _ = run_program(runner_of(cfg, engine), requests_of(cfg, groups=1, size=2), program)
    first, second = seen["first"], seen["second"]
    assert second.model == "verifier" and second.previous_response_id == first.id and second.instructions is None
    assert isinstance(first, Response) and first.object == "response" and first.status in ("completed", "incomplete")
    samples = result.samples
    assert [s.agent for s in samples] == ["solver", "verifier", "solver", "solver"]
    tokenizer = engine["policy"].tokenizer
    assert first.output_text == tokenizer.decode(samples[0].response_ids, skip_special_tokens=True)
    assert first.usage.output_tokens == len(samples[0].response_ids) <= 4
    assert first.usage.input_tokens == len(samples[0].prompt_ids) and first.id.startswith("resp_")
    prompts = [tokenizer.decode(s.prompt_ids) for s in samples]
    assert "Answer in a box." in prompts[0] and "What is 2 + 3?" in prompts[0]
    # the continuation: the first input and reply, then the new input; instructions are not carried over
    assert "What is 2 + 3?" in prompts[1] and first.output_text in prompts[1] and "Is that right?" in prompts[1]
    assert "Answer in a box." not in prompts[1]
    assert '"name": "get_weather"' in prompts[3] and "<tool_response>\nlight snow, -3 C\n</tool_response>" in prompts[3]
    assert [s.reward for s in samples] == [0.5, 1.0, 1.0, 1.0]  # the call reward names the response id


def test_streamed_chat_and_responses_carry_the_whole_reply_in_openais_formats(engine):
    """stream=true on both APIs through the real client: the chunks accumulate (the client's own stream state) to
    the reply the sample recorded, with the usage chunk when asked; the Responses stream is OpenAI's typed events
    in order, numbered, ending with the response; an error before generation is an HTTP error, not a stream."""
    seen: dict = {}

    def program(url: str, token: str) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
        eid = claim(url, token)["id"]
        seen["chunks"] = list(ask(client, eid, stream=True, stream_options={"include_usage": True}, max_tokens=5))
        seen["events"] = list(client.responses.create(model="verifier", input="Check 2 + 2 = 4.", stream=True,
                                                      max_output_tokens=3, user=eid))
        with client.responses.stream(model="solver", input="What is 1 + 1?", max_output_tokens=3, user=eid) as stream:
            seen["final"] = list(stream)[-1].response  # (get_final_response() insists on completed, not incomplete)
        with pytest.raises(openai.NotFoundError):
            ask(client, "ep-nope", stream=True)
        assert end(url, eid, {"reward": 1.0}).status_code == 200

    cfg = config_of("system.command=" + json.dumps(IDLE), "system.episode_timeout_s=30")  # a failure shows sooner
    (result,) = run_program(runner_of(cfg, engine), requests_of(cfg, groups=1, size=1), program)
    tokenizer = engine["policy"].tokenizer
    texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in result.samples]
    chunks = seen["chunks"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == texts[0]
    assert chunks[-2].choices[0].finish_reason in ("stop", "length") and len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(result.samples[0].response_ids)
    events = seen["events"]
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == texts[1]
    assert events[-1].response.output_text == texts[1]
    assert seen["final"].output_text == texts[2] and seen["final"].usage.output_tokens == len(result.samples[2].response_ids)


def test_streamed_tool_calls_and_cut_replies_as_the_client_reads_them():
    """A reply with two tool calls, streamed on both APIs and read with the client's own types: the chat chunks
    accumulate to the same message as the whole completion, the Responses events carry each call's arguments and
    the response's function_call items; a reply cut by the token cap is an `incomplete` response."""
    reply = Reply('Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Bergen"}}</tool_call>'
                  '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>', 9, 30, "stop", 3)
    call = api.decode_chat(json.dumps({"model": "solver", "messages": [{"role": "user", "content": "hi"}],
                                       "tools": [{"type": "function", "function": WEATHER | {"type": None}}],
                                       "stream": True}).encode(), ["solver"], honour_sampling=False)
    whole = api.completion("chatcmpl-x", call, [reply], "policy", parse_hermes)
    state = ChatCompletionStreamState()
    for chunk in sse.chat_chunks(whole, include_usage=False):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    streamed = state.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls" and streamed.message.content == "Checking."
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in streamed.message.tool_calls] == [
        (c["id"], "get_weather", json.loads(c["function"]["arguments"]))
        for c in whole["choices"][0]["message"]["tool_calls"]]

    request = responses_api.decode_responses(json.dumps({"model": "solver", "input": "hi", "tools": [WEATHER]}).encode(),
                                             ["solver"])
    given = responses_api.prepare(request, "ep-1", responses_api.ResponseStore(), honour_sampling=False)
    body, assistant = responses_api.response("resp_x", given, reply, "policy", parse_hermes)
    parsed = Response.model_validate(body)
    assert [o.type for o in parsed.output] == ["message", "function_call", "function_call"]
    assert [json.loads(o.arguments)["city"] for o in parsed.output[1:]] == ["Bergen", "Oslo"]
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [{"city": "Bergen"}, {"city": "Oslo"}]
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python({"type": kind, "sequence_number": n, **event})
              for n, (kind, event) in enumerate(sse.response_events(body))]
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [
        o.arguments for o in parsed.output[1:]]
    assert events[-1].type == "response.completed" and events[-1].response.id == "resp_x"

    cut, _ = responses_api.response("resp_y", given, Reply("The answer is", 9, 4, "length", 3), "policy", parse_hermes)
    cut = Response.model_validate(cut)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert list(sse.response_events(cut.model_dump()))[-1][0] == "response.incomplete"


SWITCH = {"type": "function", "name": "switch", "description": "Turn a lamp on or off.", "parameters": {
    "type": "object", "properties": {"lamp": {"type": "string", "enum": ["desk", "hall"]}, "on": {"type": "boolean"}},
    "required": ["lamp", "on"], "additionalProperties": False}}


class Verdict(BaseModel):
    verdict: Literal["approve", "reject"]
    sure: bool


def test_structured_output_and_forced_tool_calls_through_both_apis(engine):
    """JSON output formats and forced tool calls, as the openai client's parse helpers and agent frameworks send
    them, decoded under their grammar on the engine: the replies parse (as the pydantic model, as a call of the
    function with valid arguments), and the recorded sample is what came back; impossible requests are 400s."""
    seen: dict = {}
    chat_switch = {"type": "function", "function": {k: v for k, v in SWITCH.items() if k != "type"}}

    def program(url: str, token: str) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
        eid = claim(url, token)["id"]
        messages = [{"role": "user", "content": "Is 2 + 2 = 4?"}]
        seen["chat"] = client.chat.completions.parse(model="solver", messages=messages, response_format=Verdict,
                                                     user=eid)
        seen["object"] = ask(client, eid, response_format={"type": "json_object"})
        seen["required"] = ask(client, eid, tools=[chat_switch], tool_choice="required", parallel_tool_calls=False)
        seen["responses"] = client.responses.parse(model="solver", input="Is 2 + 2 = 4?", text_format=Verdict, user=eid)
        seen["named"] = client.responses.create(model="solver", input="Lights!", tools=[SWITCH], user=eid,
                                                tool_choice={"type": "function", "name": "switch"})
        for kwargs, param in ((dict(tools=[chat_switch], tool_choice={"type": "function", "function": {"name": "f"}}),
                               "tool_choice"),
                              (dict(tool_choice="required"), "tool_choice"),
                              (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
                               "response_format"),
                              (dict(response_format={"type": "yaml"}), "response_format"),
                              (dict(tools=[chat_switch], tool_choice="required", response_format={"type": "json_object"}),
                               "tool_choice")):
            with pytest.raises(openai.BadRequestError) as caught:
                ask(client, eid, **kwargs)
            assert caught.value.body["param"] == param, kwargs
        assert end(url, eid, {"reward": 1.0}).status_code == 200

    cfg = config_of("system.command=" + json.dumps(IDLE), "system.episode_timeout_s=60", "rollout.max_new_tokens=96")
    (result,) = run_program(runner_of(cfg, engine), requests_of(cfg, groups=1, size=1), program)
    tokenizer = engine["policy"].tokenizer
    texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in result.samples]
    parsed = seen["chat"].choices[0].message.parsed
    assert isinstance(parsed, Verdict) and seen["chat"].choices[0].message.content == texts[0]
    any_object = seen["object"].choices[0]  # any keys: the tiny model may write one until its token cap
    assert any_object.message.content.startswith("{") and (
        any_object.finish_reason == "length" or isinstance(json.loads(any_object.message.content), dict))
    required = seen["required"].choices[0]
    assert required.finish_reason == "tool_calls" and len(required.message.tool_calls) == 1
    assert json.loads(required.message.tool_calls[0].function.arguments)["lamp"] in ("desk", "hall")
    assert isinstance(seen["responses"].output_parsed, Verdict)
    (call,) = [o for o in seen["named"].output if o.type == "function_call"]
    assert call.name == "switch" and isinstance(json.loads(call.arguments)["on"], bool)
    assert len(result.samples) == 5  # the refused requests made no sample
