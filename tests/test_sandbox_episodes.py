"""The sandbox as an orchestra's service in the real episode runner: the programs of all live episodes reach it
as one batch, and a program that hangs, crashes or floods memory costs its own episode's reward, never the
run. The engine is scripted: its "model" writes the programs of the test, one per episode."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from drmas.config.sandbox import SandboxConfig
from drmas.engines.base import Generation, SamplingParams
from drmas.mas.base import AgentTurn, EpisodeOutcome, ServiceCall, TurnResult
from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner
from drmas.tasks.base import Problem
from drmas.tools import SandboxService


class _CharTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [ord(c) % 256 for m in messages for c in m["content"]]


@dataclass
class ScriptedCoder:
    """An engine whose "model" writes the given programs, one per prompt, in order."""

    programs: list[str]
    model_id: str = "m"
    tokenizer: object = field(default_factory=_CharTokenizer)
    version: int = 0

    def generate(self, prompts, params):
        return [Generation([1], [-0.1], self.programs.pop(0), "stop", self.version) for _ in prompts]

    def load_weights(self, named_tensors, version, incarnation=""):
        self.version = version


class Coder:
    """One turn: the coder writes a program, the sandbox runs it; reward 1 when it printed the problem's answer."""

    agents = ("coder",)

    def __init__(self, sandbox: SandboxService) -> None:
        self.services = {"python": self}
        self.sandbox = sandbox
        self.batches: list[int] = []

    def call_batch(self, requests):  # the sandbox, counting the batches the runner makes
        self.batches.append(len(requests))
        return self.sandbox.call_batch(requests)

    def run(self, problem):
        code = yield AgentTurn("coder", [{"role": "user", "content": problem.question}])
        result = yield ServiceCall("python", code)
        reward = float(result.ok and result.stdout.strip() == problem.answer)
        return EpisodeOutcome(reward=reward, turns=[TurnResult("coder", code, True)], info={"status": result.status})


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    config = SandboxConfig(timeout_s=1.5, memory_mb=256, workers=4, tmp_dir=str(tmp_path_factory.mktemp("episodes")))
    with SandboxService(config, where="test.sandbox") as service:
        yield service


def test_one_batch_per_round_and_misbehaving_programs_cost_only_their_episode(sandbox):
    programs = {"print(6 * 7)": "42", "while True: pass": "42", "import os; os.abort()": "42",
                "x = bytearray(10 * 2**30)": "42", "print(1 + 1)": "2"}
    engine = ScriptedCoder(list(programs))
    orchestra = Coder(sandbox)
    requests = [EpisodeRequest(f"e{i}", "g", Problem(f"p{i}", code, answer))
                for i, (code, answer) in enumerate(programs.items())]
    runner = EpisodeRunner(orchestra, {"m": engine}, {"coder": AgentSpec("m", SamplingParams())},
                           invalid_penalty=0.1, seed=0)
    results = runner.run(requests)
    assert orchestra.batches == [5]  # every live episode's program in one call
    assert [r.outcome.info["status"] for r in results] == ["ok", "timeout", "crashed", "memory", "ok"]
    assert [r.outcome.reward for r in results] == [1.0, 0.0, 0.0, 0.0, 1.0]
