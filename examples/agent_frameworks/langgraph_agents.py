"""The same math solver with a tool and verifier with structured output, written with LangGraph: drmas trains both
agents through its gateway.

As any LangGraph program: a graph whose solver node is a `ChatOpenAI` with `bind_tools`, streamed (`streaming=True`),
a `ToolNode` that runs its `add` calls and loops back (at most MAX_CALLS solver calls), and a verifier node whose `ChatOpenAI` (on the Responses
API) answers `with_structured_output` of a pydantic model (the gateway decodes it under its JSON schema). Around it,
drmas' episode loop: POST $DRMAS_EPISODES_URL hands out a problem and its id (sent with every model call as the
X-Drmas-Episode header), POST $DRMAS_EPISODES_URL/<id>/reward ends it with the solver's answer, which drmas grades;
the ids of calls whose reply had the wrong format go in `invalid_calls` (a streamed ChatOpenAI keeps no completion
id, so each model's httpx client records the X-Drmas-Completion-Id header of its calls)."""

import json
import os
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

EPISODES = os.environ["DRMAS_EPISODES_URL"]
HEADER = os.environ.get("DRMAS_EPISODE_HEADER", "X-Drmas-Episode")
MAX_CALLS = int(os.environ.get("MAX_CALLS", "3"))  # solver calls per episode: then the verifier checks what it has
SYSTEM = "Solve the math question. Call add for sums, then give the final number in \\boxed{}."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Verdict(BaseModel):
    verdict: Literal["approve", "reject"]


class State(MessagesState):
    question: str


def recording(ids: list) -> httpx.Client:
    """An httpx client that appends the completion id of every call it makes to `ids`."""
    return httpx.Client(timeout=120, event_hooks={"response": [
        lambda response: ids.append(response.headers.get("x-drmas-completion-id"))]})


def graph(episode: str, solver_ids: list, verifier_ids: list, verdicts: list):
    """The episode's graph: its models send the episode id with every call (OPENAI_BASE_URL and OPENAI_API_KEY
    point at the gateway) and record their calls' ids; the verifier's parsed verdicts (None: did not parse) go to
    `verdicts` as they come (a run that fails afterwards, at the recursion limit, keeps them)."""
    headers = {HEADER: episode}
    solver = ChatOpenAI(model="solver", streaming=True, default_headers=headers, max_retries=0,
                        http_client=recording(solver_ids)).bind_tools([add])
    verifier = ChatOpenAI(model="verifier", use_responses_api=True, default_headers=headers, max_retries=0,
                          http_client=recording(verifier_ids))
    judge = verifier.with_structured_output(Verdict, include_raw=True)

    def solve(state: State) -> dict:
        return {"messages": [solver.invoke(state["messages"])]}

    def verify(state: State) -> dict:
        answer = state["messages"][-1].content
        checked = judge.invoke(f"Question: {state['question']}\nProposed answer: {answer}\n"
                               "Approve the answer if it is right, else reject it.")
        parsed = checked["parsed"]
        verdicts.append(parsed)
        if parsed is None:
            print(f"verifier reply did not parse: {checked['parsing_error']}: {checked['raw'].content!r}", flush=True)
        return {"messages": []}

    built = StateGraph(State)
    built.add_node("solver", solve)
    built.add_node("tools", ToolNode([add]))
    built.add_node("verifier", verify)
    built.add_edge(START, "solver")
    def route(state: State) -> str:
        calls = sum(m.type == "ai" for m in state["messages"])
        return "tools" if tools_condition(state) == "tools" and calls < MAX_CALLS else "verifier"

    built.add_conditional_edges("solver", route, ["tools", "verifier"])
    built.add_edge("tools", "solver")
    built.add_edge("verifier", END)
    return built.compile()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {
        "Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def episode() -> None:
    claim = post(EPISODES, {})
    question = claim["problem"]["question"]
    start = {"messages": [SystemMessage(SYSTEM), HumanMessage(question)], "question": question}
    solver_ids, verifier_ids, verdicts = [], [], []
    try:
        final = graph(claim["id"], solver_ids, verifier_ids, verdicts).invoke(start, {"recursion_limit": 4 * MAX_CALLS})
    except Exception as exc:  # a failed call: the episode ends without an answer
        print(f"episode {claim['id']} failed: {type(exc).__name__}: {exc}", flush=True)
        final = {"messages": []}
    replies = [m for m in final["messages"] if m.type == "ai"]
    answer = replies[-1].content if replies and not replies[-1].tool_calls else ""
    invalid = [] if re.search(r"\\boxed\{", answer) else solver_ids[-1:]
    invalid += [call for call, verdict in zip(verifier_ids, verdicts) if verdict is None]
    post(f"{EPISODES}/{claim['id']}/reward", {"answer": answer, "invalid_calls": [i for i in invalid if i]})


def worker() -> None:
    while True:
        try:
            episode()
        except urllib.error.HTTPError as exc:  # 503: no episode to hand out yet
            if exc.code != 503:
                print(f"episode failed: {exc}", flush=True)


if __name__ == "__main__":
    workers = int(os.environ.get("DRMAS_EPISODES_IN_FLIGHT", "8"))
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(workers):
            pool.submit(worker)
