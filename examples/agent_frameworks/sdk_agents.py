"""A math solver with a tool and a verifier with structured output, written with the OpenAI Agents SDK on its
defaults: drmas trains both agents through its gateway.

As any SDK program: `Agent(model="solver")` on the default provider (the Responses API), runs streamed
(`Runner.run_streamed`), the solver offered an `add` function tool, the verifier answering a pydantic
`output_type` (structured output: the gateway decodes it under its JSON schema). What drmas adds is the episode
loop around it: POST $DRMAS_EPISODES_URL hands out a problem and its id (sent with every model call as the
X-Drmas-Episode header), POST $DRMAS_EPISODES_URL/<id>/reward ends it with the solver's answer, which drmas
grades (both agents' calls get that reward). The response ids of calls whose
reply had the wrong format go in `invalid_calls` (drmas' format penalty). The SDK's tracing is off in a program
drmas starts (it would send the run's token to OpenAI; docs/gateway.md)."""

import asyncio
import json
import os
import re
import urllib.error
import urllib.request
from typing import Literal

from agents import Agent, ModelSettings, RunConfig, RunHooks, Runner, function_tool
from pydantic import BaseModel

EPISODES = os.environ["DRMAS_EPISODES_URL"]
HEADER = os.environ.get("DRMAS_EPISODE_HEADER", "X-Drmas-Episode")


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Verdict(BaseModel):
    verdict: Literal["approve", "reject"]


solver = Agent(name="solver", model="solver", tools=[add],
               instructions="Solve the math question. Call add for sums, then give the final number in \\boxed{}.")
verifier = Agent(name="verifier", model="verifier", output_type=Verdict,
                 instructions="Check the proposed answer to the math question: approve it if it is right, else reject.")


class ResponseIds(RunHooks):
    """The response id of every model call of a run (the completion ids drmas' rewards name)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def on_llm_end(self, context, agent, response) -> None:
        self.ids.append(response.response_id)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {
        "Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


async def run(agent: Agent, prompt: str, episode: str):
    """One streamed run of `agent` in `episode`: (its final output or None when the run failed, its response ids)."""
    hooks = ResponseIds()
    config = RunConfig(model_settings=ModelSettings(extra_headers={HEADER: episode}))
    try:
        result = Runner.run_streamed(agent, prompt, run_config=config, hooks=hooks, max_turns=3)
        async for _ in result.stream_events():
            pass
        return result.final_output, hooks.ids
    except Exception as exc:  # a reply cut by the token cap, too many turns, an unparsable output: a bad episode
        print(f"{agent.name} failed: {type(exc).__name__}: {exc}", flush=True)
        return None, hooks.ids


async def episode() -> None:
    claim = await asyncio.to_thread(post, EPISODES, {})
    question, episode_id = claim["problem"]["question"], claim["id"]
    answer, solver_ids = await run(solver, question, episode_id)
    boxed = re.findall(r"\\boxed\{([^}]*)\}", answer or "")
    invalid = [] if boxed else solver_ids[-1:]
    verdict, verifier_ids = await run(verifier, f"Question: {question}\nProposed answer: {boxed[-1] if boxed else answer}",
                                      episode_id)
    invalid += [] if isinstance(verdict, Verdict) else verifier_ids
    await asyncio.to_thread(post, f"{EPISODES}/{episode_id}/reward", {"answer": answer or "", "invalid_calls": invalid})


async def worker() -> None:
    while True:
        try:
            await episode()
        except urllib.error.HTTPError as exc:  # 503: no episode to hand out yet
            if exc.code != 503:
                print(f"episode failed: {exc}", flush=True)


async def main() -> None:
    await asyncio.gather(*(worker() for _ in range(int(os.environ.get("DRMAS_EPISODES_IN_FLIGHT", "8")))))


if __name__ == "__main__":
    asyncio.run(main())
