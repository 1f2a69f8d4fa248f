"""The external orchestra driven by hand, as the runner drives it, without an engine: a test plays both the
program (over HTTP, with the real `openai` client) and the driver (it takes the program's calls from the
`gateway` service and sends the episode generator the replies it makes up)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import openai

from drmas import assembly
from drmas.gateway.inbox import Call
from drmas.mas.base import AgentTurn, ServiceCall

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openai_agents"
IDLE = ["python", "-c", "import time; time.sleep(600)"]  # a program that calls nothing: the test calls instead


def build(*overrides: str):
    """The example's external orchestra with an idle program; `.problem`: a train problem to run."""
    cfg = assembly.load_config(EXAMPLE / "config.yaml", [f"system.workdir={EXAMPLE}",
                                                         "system.command=" + json.dumps(IDLE), *overrides])
    task = assembly.build_task(cfg)
    orchestra = assembly.build_orchestra(cfg, task)
    orchestra.problem = next(iter(task.split("train")))
    return orchestra


def close_within(orchestra, timeout_s: float) -> float:
    """Close the orchestra in a thread (a hang must fail the test, not block it); returns how long it took."""
    start = time.monotonic()
    closer = threading.Thread(target=assembly.close_orchestra, args=(orchestra,), daemon=True)
    closer.start()
    closer.join(timeout_s)
    assert not closer.is_alive(), f"the gateway did not stop within {timeout_s:g} s"
    return time.monotonic() - start


class Episode:
    """One episode of `orchestra`: started (the gateway serves), claimed over HTTP, its generator at hand."""

    def __init__(self, orchestra) -> None:
        self.orchestra = orchestra
        self.generator = orchestra.run(orchestra.problem)
        first = next(self.generator)  # starts the gateway and the program, opens the episode
        assert isinstance(first, ServiceCall)
        self.driver_id = first.request  # the gateway's episode id, which the driver waits on
        url = orchestra.service.url
        self.id = httpx.post(f"{url}/drmas/v1/episodes", json={}).json()["id"]
        assert self.id == self.driver_id
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=orchestra.service.token, max_retries=0)

    def call_in_thread(self, request: Callable[[openai.OpenAI, str], Any]) -> tuple[dict, threading.Thread]:
        """Run `request(client, episode id)` in a thread; what it returns (or raises) lands in the dict."""
        got: dict = {}

        def call() -> None:
            try:
                got["reply"] = request(self.client, self.id)
            except openai.APIError as exc:
                got["error"] = exc

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        return got, caller

    def take_call(self, timeout_s: float = 30.0) -> AgentTurn:
        """The driver's part: take the program's next call and start generating it (the AgentTurn it yields)."""
        deadline = time.monotonic() + timeout_s
        while True:
            (event,) = self.orchestra.services["gateway"].call_batch([self.driver_id])
            if isinstance(event, Call):
                break
            assert time.monotonic() < deadline, "the call never reached the driver"
            time.sleep(0.01)
        turn = self.generator.send(event)
        assert isinstance(turn, AgentTurn)
        return turn


def ask_solver(client: openai.OpenAI, episode_id: str, **kwargs):
    return client.chat.completions.create(model="solver", user=episode_id,
                                          messages=[{"role": "user", "content": "hi"}], **kwargs)
