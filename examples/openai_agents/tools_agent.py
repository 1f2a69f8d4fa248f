"""A tool-calling math agent in plain OpenAI client code (the loop every agent framework runs): drmas trains it
through its gateway, tool calls included.

The agent is offered an `add` function. While its reply calls tools, the program runs each call and sends the
results back as `tool` messages; a reply without calls is the final answer, graded by drmas. A reply that is
neither (no call, no \\boxed{} answer) is reported in `invalid_calls` and draws drmas' format penalty. Each model
call is a sample of the agent `solver`; the tool results are part of the next call's prompt, not samples."""

import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from drmas
EPISODES, MAX_CALLS = os.environ["DRMAS_EPISODES_URL"], int(os.environ.get("MAX_CALLS", "3"))
SYSTEM = "Solve the math question. Call add for sums, then give the final number in \\boxed{}."
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {
        "Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"])) if name == "add" else f"unknown function {name!r}"
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def episode() -> None:
    claim = post(EPISODES, {})
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": claim["problem"]["question"]}]
    answer, invalid = "", []
    for _ in range(MAX_CALLS):
        reply = client.chat.completions.create(model="solver", messages=messages, tools=TOOLS, user=claim["id"])
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            invalid += [] if "\\boxed{" in answer else [reply.id]
            break
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name, c.function.arguments)}
                     for c in message.tool_calls]
    post(f"{EPISODES}/{claim['id']}/reward", {"answer": answer, "invalid_calls": invalid})


def worker() -> None:
    while True:
        try:
            episode()
        except urllib.error.HTTPError as exc:  # 503: no episode to run yet; anything else: go on with the next
            if exc.code != 503:
                print(f"episode failed: {exc}: {exc.read().decode(errors='replace')}", flush=True)


if __name__ == "__main__":
    workers = int(os.environ.get("DRMAS_EPISODES_IN_FLIGHT", "8"))
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(workers):
            pool.submit(worker)
