"""EpisodeRunner without models: a scripted engine and a two-agent orchestra show how rounds are batched,
how `stream` admits and hands over episodes, and where the `on_round` hook lets weights change."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from drmas.engines.base import Generation, SamplingParams
from drmas.mas.base import AgentTurn, EpisodeOutcome, TurnResult
from drmas.rollout.episodes import AgentSpec, EpisodeRequest, EpisodeRunner
from drmas.tasks.base import Problem


class _Tokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [len(m["content"]) for m in messages]


@dataclass
class ScriptedEngine:
    """Answers every prompt with 'ok'; records batch sizes; its version is whatever the test sets."""

    model_id: str = "m"
    tokenizer: object = field(default_factory=_Tokenizer)
    version: int = 0
    batches: list[int] = field(default_factory=list)

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return [Generation([1, 2], [-0.5, -0.5], "ok", "stop", self.version) for _ in prompts]

    def load_weights(self, named_tensors, version):
        self.version = version


class TwoTurns:
    """Episode = `turns` alternating calls of agents a and b; reward 1."""

    agents = ("a", "b")

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns

    def run(self, problem):
        results = []
        for i in range(self.turns):
            agent = self.agents[i % 2]
            text = yield AgentTurn(agent, [{"role": "user", "content": problem.question}])
            results.append(TurnResult(agent, text, valid=True))
        return EpisodeOutcome(reward=1.0, turns=results)


def _runner(engine: ScriptedEngine, turns: int = 2, on_round=None) -> EpisodeRunner:
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    return EpisodeRunner(TwoTurns(turns), {"m": engine}, specs, invalid_penalty=0.1, seed=0, on_round=on_round)


def _requests(n: int, prefix: str = "e") -> list[EpisodeRequest]:
    return [EpisodeRequest(f"{prefix}{i}", "g", Problem(f"p{i}", "q", "1")) for i in range(n)]


def test_run_batches_all_live_episodes_per_round_and_keeps_order():
    engine = ScriptedEngine()
    results = _runner(engine).run(_requests(3))
    assert engine.batches == [3, 3]
    assert [r.request.episode_id for r in results] == ["e0", "e1", "e2"]
    assert [[s.agent for s in r.samples] for r in results] == [["a", "b"]] * 3


def test_on_round_runs_between_rounds_and_later_turns_carry_the_new_version():
    engine = ScriptedEngine()
    calls = []

    def swap() -> None:
        calls.append(len(engine.batches))
        engine.version = len(calls) - 1  # round 0 on version 0, round 1 on version 1

    results = _runner(engine, on_round=swap).run(_requests(2))
    assert calls == [0, 1]  # before each round, never during one
    assert [[s.policy_version for s in r.samples] for r in results] == [[0, 1], [0, 1]]


def test_stream_admits_before_rounds_and_hands_over_each_episode_when_it_ends():
    engine = ScriptedEngine()
    waves = [_requests(2, "x"), [], _requests(1, "y")]
    seen_live, finished = [], []

    def admit(live: int):
        seen_live.append(live)
        return waves.pop(0) if waves else None

    _runner(engine).stream(admit, lambda r: finished.append((r.request.episode_id, len(engine.batches))))
    # x0, x1 take rounds 1-2 (nothing joins before round 2); y0 joins once they ended and takes rounds 3-4
    assert engine.batches == [2, 2, 1, 1]
    assert seen_live == [0, 2, 0, 1]
    assert finished == [("x0", 2), ("x1", 2), ("y0", 4)]


def test_stream_stops_when_a_callback_raises():
    engine = ScriptedEngine()

    def admit(live: int):
        if engine.batches:
            raise KeyboardInterrupt
        return _requests(2)

    with pytest.raises(KeyboardInterrupt):
        _runner(engine, turns=4).stream(admit, lambda r: None)
    assert engine.batches == [2]
