"""EpisodeRunner without models: a scripted engine and small orchestras show how rounds and service calls are
batched, how `stream` admits and hands over episodes, and where the `on_round` hook lets weights change."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import pytest

from drmas.engines.base import Generation, SamplingParams
from drmas.mas.base import AgentTurn, EpisodeOutcome, ServiceCall, TurnResult
from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner
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

    def load_weights(self, named_tensors, version, incarnation=""):
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


# --- service calls --------------------------------------------------------------------------------------------


@dataclass
class RecordingService:
    """Upper-cases its requests; records each batch it was called with."""

    batches: list[list[str]] = field(default_factory=list)
    short_by: int = 0  # return this many results too few (a broken service)

    def call_batch(self, requests):
        self.batches.append(list(requests))
        return [r.upper() for r in requests][: len(requests) - self.short_by]


class LookUpTwice:
    """Episode: agent a speaks, then `lookups` service calls in a row, then agent b answers; the service results
    reach b's prompt, so a test can see each episode got its own."""

    agents = ("a", "b")

    def __init__(self, service: RecordingService, lookups: int = 2, service_name: str = "upper") -> None:
        self.services = {"upper": service}
        self.lookups = lookups
        self.service_name = service_name

    def run(self, problem):
        first = yield AgentTurn("a", [{"role": "user", "content": problem.question}])
        found = []
        for i in range(self.lookups):
            found.append((yield ServiceCall(self.service_name, f"{problem.uid}-{i}")))
        second = yield AgentTurn("b", [{"role": "user", "content": " ".join(found)}])
        return EpisodeOutcome(reward=1.0, turns=[TurnResult("a", first, True), TurnResult("b", second, True)],
                              info={"found": found})


def _service_runner(engine: ScriptedEngine, orchestra) -> EpisodeRunner:
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    return EpisodeRunner(orchestra, {"m": engine}, specs, invalid_penalty=0.1, seed=0)


def test_service_calls_of_all_live_episodes_are_batched_per_round_and_results_reach_their_episode():
    engine, service = ScriptedEngine(), RecordingService()
    results = _service_runner(engine, LookUpTwice(service)).run(_requests(3))
    # one service batch per lookup round, holding the three episodes' requests; service rounds add no engine call
    assert service.batches == [["p0-0", "p1-0", "p2-0"], ["p0-1", "p1-1", "p2-1"]]
    assert engine.batches == [3, 3]
    assert [r.outcome.info["found"] for r in results] == [[f"P{i}-0", f"P{i}-1"] for i in range(3)]
    assert [[s.agent for s in r.samples] for r in results] == [["a", "b"]] * 3  # service calls are not samples


def test_service_calls_do_not_change_what_is_sampled():
    """Sampling seeds follow the agent turn index, so a system's tokens do not shift when it gains a service."""
    with_services = _service_runner(ScriptedEngine(), LookUpTwice(RecordingService())).run(_requests(2))
    plain = _runner(ScriptedEngine()).run(_requests(2))
    assert [[s.turn for s in r.samples] for r in with_services] == [[s.turn for s in r.samples] for r in plain]


def test_unknown_service_drops_the_episode_naming_it():
    orchestra = LookUpTwice(RecordingService(), service_name="search")
    (result,) = _service_runner(ScriptedEngine(), orchestra).run(_requests(1))
    assert result.failure.kind == "orchestra" and result.samples == []
    assert re.search("service 'search'.*ValueError.*'search'.*its services: \\['upper'\\]", result.failure.describe())


def test_a_service_that_loses_results_drops_every_episode_of_its_batch():
    runner = _service_runner(ScriptedEngine(), LookUpTwice(RecordingService(short_by=1)))
    results = runner.run(_requests(2))
    assert runner.failed == 2
    for result in results:
        assert "service 'upper' returned 1 results for 2 requests" in result.failure.describe()


# --- per-turn rewards and scripted agents -----------------------------------------------------------------------


class Judged:
    """Episode: a, b, a (b's reply invalid), rewarded by whatever outcome fields the test gives."""

    agents = ("a", "b")

    def __init__(self, **outcome) -> None:
        self.outcome = outcome

    def run(self, problem):
        turns = []
        for agent, valid in (("a", True), ("b", False), ("a", True)):
            text = yield AgentTurn(agent, [{"role": "user", "content": problem.question}])
            turns.append(TurnResult(agent, text, valid))
        return EpisodeOutcome(turns=turns, **{"reward": 1.0, **self.outcome})


def _rewards(**outcome) -> list[float]:
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    (result,) = EpisodeRunner(Judged(**outcome), {"m": ScriptedEngine()}, specs, invalid_penalty=0.1).run(_requests(1))
    assert [s.episode_reward for s in result.samples] == [outcome.get("reward", 1.0)] * 3
    return [s.reward for s in result.samples]


def test_a_turn_takes_its_turn_reward_else_its_agents_else_the_episodes_minus_the_format_penalty():
    assert _rewards() == [1.0, 0.9, 1.0]
    assert _rewards(agent_rewards={"b": 0.0}) == [1.0, -0.1, 1.0]
    assert _rewards(reward=0.0, agent_rewards={"a": 0.5}) == [0.5, -0.1, 0.5]
    assert _rewards(agent_rewards={"a": 0.5}, turn_rewards=[0.25, None, None]) == [0.25, 0.9, 0.5]
    assert _rewards(agent_rewards={"a": 0.5, "b": 0.5}, turn_rewards=[0.0, 2.0, -1.0]) == [0.0, 1.9, -1.0]


@pytest.mark.parametrize(("outcome", "message"), [
    ({"turn_rewards": [1.0, 1.0]}, "2 turn_rewards for 3 turns in episode e0"),
    ({"agent_rewards": {"solver": 1.0}}, r"agent_rewards for \['solver'\] in episode e0, which are not agents"),
    ({"turn_rewards": [1.0, float("nan"), 1.0]}, "not a finite number .* for turn 1 \\(b\\) in episode e0"),
    ({"agent_rewards": {"a": "high"}}, "not a finite number .* for turn 0 \\(a\\)"),
    ({"reward": 1e39}, "not a finite number within float32's range .*1e\\+39.* for turn 0 \\(a\\)"),
    ({"agent_rewards": {"b": -3.5e38}}, "float32's range .* for turn 1 \\(b\\)"),
])
def test_rewards_that_cannot_be_trained_on_drop_the_episode_naming_it(outcome, message):
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    (result,) = EpisodeRunner(Judged(**outcome), {"m": ScriptedEngine()}, specs, invalid_penalty=0.1).run(_requests(1))
    assert result.samples == [] and re.search(message, result.failure.describe())


class WithReferee:
    """Episode: a speaks, the referee (scripted) answers with what it saw, b speaks with the referee's reply."""

    agents = ("a", "b", "ref")

    def run(self, problem):
        turns = []
        first = yield AgentTurn("a", [{"role": "user", "content": problem.question}])
        turns.append(TurnResult("a", first, True))
        verdict = yield AgentTurn("ref", [{"role": "user", "content": first}], state=problem.uid)
        turns.append(TurnResult("ref", verdict, True))
        second = yield AgentTurn("b", [{"role": "user", "content": verdict}])
        turns.append(TurnResult("b", second, True))
        return EpisodeOutcome(reward=1.0, turns=turns, info={"verdict": verdict}, agent_rewards={"ref": 5.0})


def test_a_scripted_agents_turns_are_answered_by_its_code_and_make_no_sample():
    engine = ScriptedEngine()
    seen = []

    def referee(turn: AgentTurn) -> str:
        seen.append(turn.state)
        return f"{turn.state} said {turn.messages[-1]['content']}"

    specs = {"a": AgentSpec("m", SamplingParams()), "b": AgentSpec("m", SamplingParams()),
             "ref": AgentSpec("", None, script=referee)}
    results = EpisodeRunner(WithReferee(), {"m": engine}, specs, invalid_penalty=0.1, seed=0).run(_requests(2))
    assert engine.batches == [2, 2]  # the referee's turns cost no engine round
    assert seen == ["p0", "p1"]
    assert [r.outcome.info["verdict"] for r in results] == ["p0 said ok", "p1 said ok"]
    assert [[(s.agent, s.turn, s.reward) for s in r.samples] for r in results] == [[("a", 0, 1.0), ("b", 2, 1.0)]] * 2


def test_a_failing_scripted_agent_is_named():
    def broken(turn: AgentTurn) -> str:
        raise KeyError("board")

    specs = {"a": AgentSpec("m", SamplingParams()), "b": AgentSpec("m", SamplingParams()),
             "ref": AgentSpec("", None, script=broken)}
    (result,) = EpisodeRunner(WithReferee(), {"m": ScriptedEngine()}, specs, invalid_penalty=0.1).run(_requests(1))
    assert result.failure.describe() == "scripted agent 'ref' failed in episode e0: KeyError: 'board'"


# --- a failing plugin costs its episode ---------------------------------------------------------------------------


class FailsOn(TwoTurns):
    """One turn of agent a; episodes of the given problem uids raise instead of ending after it."""

    def __init__(self, *uids: str) -> None:
        super().__init__(turns=1)
        self.uids = uids

    def run(self, problem):
        if problem.uid in self.uids:
            yield AgentTurn("a", [{"role": "user", "content": problem.question}])
            raise ZeroDivisionError(f"bad {problem.uid}")
        return (yield from super().run(problem))


def _failing_runner(*uids: str, limit: int = 2) -> EpisodeRunner:
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    return EpisodeRunner(FailsOn(*uids), {"m": ScriptedEngine()}, specs, invalid_penalty=0.1, max_consecutive_failures=limit)


def test_failures_between_successes_are_dropped_and_counted_and_never_stop_the_runner():
    runner = _failing_runner("p0", "p2", "p4")  # fail, succeed, fail, succeed, fail: never 2 in a row
    results = runner.run(_requests(5))
    assert runner.failed == 3
    assert [r.failure is None for r in results] == [False, True, False, True, False]
    assert [len(r.samples) for r in results] == [0, 1, 0, 1, 0]
    assert results[2].failure.describe() == "orchestra 'FailsOn' at agent 'a' failed in episode e2: ZeroDivisionError: bad p2"


def test_failures_in_a_row_stop_the_runner_naming_the_plugin():
    from drmas.episodes.failures import EpisodeFailures

    with pytest.raises(EpisodeFailures, match="2 episodes in a row failed .* orchestra 'FailsOn' at agent 'a' "
                                              "failed in episode e1: ZeroDivisionError: bad p1"):
        _failing_runner("p0", "p1").run(_requests(3))


def test_a_fatal_error_from_a_service_is_no_episodes_failure_and_ends_the_run():
    from drmas.core.errors import Fatal

    class Gone(RecordingService):
        def call_batch(self, requests):
            raise Fatal("the server behind the service is gone for good")

    with pytest.raises(Fatal, match="gone for good"):
        _service_runner(ScriptedEngine(), LookUpTwice(Gone())).run(_requests(2))


def test_a_service_failing_on_one_request_logs_one_traceback_for_it(caplog):
    """Issue 33, defect 6: the service's batch raises, then each request goes alone; the traceback of the request's
    failure is logged alone, not after the batch's ("During handling of the above exception...")."""

    class FailsOnP1(RecordingService):
        def call_batch(self, requests):
            if "p1-0" in requests:
                raise ConnectionError("lost p1-0")
            return super().call_batch(requests)

    with caplog.at_level(logging.WARNING, logger="drmas.episodes.failures"):
        results = _service_runner(ScriptedEngine(), LookUpTwice(FailsOnP1(), lookups=1)).run(_requests(3))
    assert [r.failure is None for r in results] == [True, False, True]
    (record,) = [r for r in caplog.records if r.getMessage().startswith("episode dropped")]
    text = logging.Formatter().format(record)
    assert text.count("Traceback (most recent call last)") == 1 and "During handling" not in text
