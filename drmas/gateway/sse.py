"""Streamed answers (`stream: true`): a finished chat completion or response as OpenAI's server-sent events.

The engines generate a call in the rollout's batches and hand the reply over whole, so the stream is written once
the call is generated: the same events, in the same order and format, that OpenAI sends while it generates (a
client that renders tokens as they come shows the reply at once), and the sample is recorded once, whole, as
for a call without streaming. Errors found before generation ends (a bad request, an engine refusal, a gone
episode) are answered with their HTTP status, as without streaming, since nothing has been sent yet.

Chat completions: `chat.completion.chunk` objects (a role chunk, the content, each tool call with its whole
arguments, a last chunk with the finish reason per choice, the usage chunk with `stream_options.include_usage`),
then `data: [DONE]`. Responses: the typed events (`response.created`, `response.in_progress`, per output item
`response.output_item.added`, its text or arguments deltas and their `.done` events, `response.output_item.done`,
then `response.completed`, or `response.incomplete` for a reply cut by the token cap), each with its
`sequence_number`, and no `[DONE]`.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional

import msgspec
from starlette.responses import Response


def chat_chunks(completion: dict, include_usage: bool) -> Iterator[dict]:
    """The chunks of a chat.completion object, as OpenAI streams them."""
    head = {key: completion[key] for key in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"

    def chunk(index: int, delta: dict, finish: Optional[str] = None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice], **({"usage": None} if include_usage else {})}

    for choice in completion["choices"]:
        index, message = choice["index"], choice["message"]
        yield chunk(index, {"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk(index, {"content": message["content"]})
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk(index, {"tool_calls": [{"index": k, **call}]})
        yield chunk(index, {}, choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": completion["usage"]}


def response_events(response: dict) -> Iterator[tuple[str, dict]]:
    """(event type, event) of a response object, as OpenAI streams them."""
    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield "response.created", {"response": started}
    yield "response.in_progress", {"response": started}
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            yield "response.output_item.added", {"output_index": index, "item": {**item, "status": "in_progress",
                                                                                 "content": []}}
            for part_index, part in enumerate(item["content"]):
                at = {**where, "content_index": part_index}
                yield "response.content_part.added", {**at, "part": {**part, "text": ""}}
                yield "response.output_text.delta", {**at, "delta": part["text"], "logprobs": []}
                yield "response.output_text.done", {**at, "text": part["text"], "logprobs": []}
                yield "response.content_part.done", {**at, "part": part}
        else:  # function_call
            yield "response.output_item.added", {"output_index": index, "item": {**item, "arguments": "",
                                                                                 "status": "in_progress"}}
            yield "response.function_call_arguments.delta", {**where, "delta": item["arguments"]}
            yield "response.function_call_arguments.done", {**where, "name": item["name"],
                                                            "arguments": item["arguments"]}
        yield "response.output_item.done", {"output_index": index, "item": item}
    yield ("response.incomplete" if response["status"] == "incomplete" else "response.completed"), {"response": response}


def stream_chat(completion: dict, include_usage: bool, headers: Mapping[str, str]) -> Response:
    lines = [b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chat_chunks(completion, include_usage)]
    return _events(lines + [b"data: [DONE]\n\n"], headers)


def stream_response(response: dict, headers: Mapping[str, str]) -> Response:
    lines = [f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode({"type": kind, "sequence_number": n,
                                                                           **event}) + b"\n\n"
             for n, (kind, event) in enumerate(response_events(response))]
    return _events(lines, headers)


def _events(lines: list[bytes], headers: Mapping[str, str]) -> Response:
    """The whole event stream in one body: every event is known when it is sent."""
    return Response(b"".join(lines), media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})
