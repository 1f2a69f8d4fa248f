"""Every episode is bounded: an orchestra that never returns, or plugin code that blocks, costs its episode (dropped,
logged once with where it was, counted per reason), never the runner. EpisodeRunner with the scripted engine of
test_episodes.py; the same plugins trained in the colocated loop and the async pipeline: test_stuck_plugins.py."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from test_episodes import LookUpTwice, RecordingService, ScriptedEngine, TwoTurns, _requests

from drmas.engines.base import SamplingParams
from drmas.evaluation import heldout_accuracy
from drmas.mas.base import AgentTurn, ServiceCall
from drmas.episodes.bounds import DEFAULT_BOUNDS, EpisodeBounds
from drmas.episodes import AgentSpec, EpisodeRunner
from drmas.episodes.failures import EpisodeFailures
from drmas.episodes.plugin_thread import PluginThread, Stuck
from drmas.tasks.base import Problem

LONG = 30.0  # how long a blocked call blocks when the test does not release it


class Misbehaves(TwoTurns):
    """Two turns of agents a and b, except on problem p1: there it does `how` (forever, or blocks)."""

    agents = ("a", "b", "ref")

    def __init__(self, how: str, release: threading.Event | None = None) -> None:
        super().__init__()
        self.how, self.release = how, release or threading.Event()
        self.services = {"upper": RecordingService()}

    def run(self, problem):
        if problem.uid == "p1":
            if self.how == "sleeps":
                self.release.wait(LONG)  # a time.sleep the test can end
            while self.how.startswith("forever"):
                if self.how == "forever services":
                    yield ServiceCall("upper", "x")
                else:
                    yield AgentTurn("ref" if self.how == "forever scripted" else "a", [{"role": "user", "content": "go"}])
        return (yield from super().run(problem))


def _runner(orchestra, bounds: EpisodeBounds = DEFAULT_BOUNDS, script=None, limit: int = 32) -> EpisodeRunner:
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    specs["ref"] = AgentSpec("", None, script=script or (lambda turn: "fine"))
    return EpisodeRunner(orchestra, {"m": ScriptedEngine()}, specs, invalid_penalty=0.1, seed=0,
                         max_consecutive_failures=limit, bounds=bounds)


def _bounds(**changes) -> EpisodeBounds:
    return EpisodeBounds(**{**DEFAULT_BOUNDS.__dict__, "max_turns": 6, "max_tool_calls": 6, **changes})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("how", "reason", "message"), [
    ("forever", "turns", "at agent 'a' failed in episode e1: OverBound: asked for agent turn 7, past "
                         "rollout.max_episode_turns=6"),
    ("forever scripted", "turns", "at agent 'ref' failed in episode e1: OverBound: asked for agent turn 7"),
    ("forever services", "tool_calls", "at service 'upper' failed in episode e1: OverBound: asked for service call 7, "
                                       "past rollout.max_episode_tool_calls=6"),
])
def test_an_episode_that_never_ends_is_dropped_at_its_turn_bound(how, reason, message, caplog):
    runner = _runner(Misbehaves(how), _bounds())
    with caplog.at_level(logging.WARNING, logger="drmas.episodes.failures"):
        results = runner.run(_requests(3))
    assert [r.failure is None for r in results] == [True, False, True]
    assert message in results[1].outcome.dropped and results[1].samples == []
    scalars = runner.failure_scalars()
    assert scalars["rollout/episodes_failed"] == 1 and scalars[f"rollout/episodes_over_bound/{reason}"] == 1
    assert sum(v for k, v in scalars.items() if k.startswith("rollout/episodes_over_bound/")) == 1
    (record,) = [r for r in caplog.records if r.getMessage().startswith("episode dropped")]
    # where the orchestra was: its yield, in this file
    assert "where it was" in record.getMessage() and "test_episode_bounds.py" in record.getMessage()


@pytest.mark.timeout(60)
def test_the_turn_bound_never_bites_an_episode_within_it():
    results = _runner(TwoTurns(turns=6), _bounds()).run(_requests(2))
    assert all(r.failure is None and len(r.samples) == 6 for r in results)


@pytest.mark.timeout(60)
def test_an_episode_past_its_wall_time_is_dropped_wherever_it_waits():
    """An orchestra asking for turns without end, under a turn bound that never bites: its time does. (The bound
    is 2 s, not less: the episodes beside it, two turns each, must end within it on a loaded machine too.)"""
    runner = _runner(Misbehaves("forever"), _bounds(max_turns=10**9, timeout_s=2.0))
    start = time.monotonic()
    results = runner.run(_requests(3))
    assert time.monotonic() - start < 30
    assert [r.failure is None for r in results] == [True, False, True]
    assert "at agent 'a' failed in episode e1: OverBound: did not end within rollout.episode_timeout_s=2 s" \
        in results[1].outcome.dropped
    assert runner.failure_scalars()["rollout/episodes_over_bound/time"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("who", "expected"), [
    ("orchestra", "orchestra 'Misbehaves' failed in episode e1: OverBound: a plugin call did not return within "
                  "rollout.plugin_call_timeout_s=0.5 s and was abandoned in its thread; blocked at "
                  "test_episode_bounds.py:"),
    ("scripted agent", "scripted agent 'ref' failed in episode e1: OverBound: a plugin call did not return"),
    ("service", "service 'upper' at call_batch failed in episode e"),
])
def test_plugin_code_that_blocks_costs_its_episodes_and_the_others_go_on(who, expected, caplog):
    release = threading.Event()
    orchestra = Misbehaves("sleeps" if who == "orchestra" else "", release)
    orchestra.agents = ("a", "b", "ref")

    def referee(turn):
        release.wait(LONG)
        return "fine"

    if who == "service":
        orchestra = LookUpTwice(_Blocking(release), lookups=1)
    elif who == "scripted agent":
        orchestra = _WithReferee()
    runner = _runner(orchestra, _bounds(call_timeout_s=0.5), script=referee)
    try:
        with caplog.at_level(logging.WARNING, logger="drmas.episodes.failures"):
            start = time.monotonic()
            results = runner.run(_requests(3))
        assert time.monotonic() - start < 10
        failed = [r for r in results if r.failure is not None]
        assert failed and all(expected in r.outcome.dropped for r in failed)
        assert runner.failure_scalars()["rollout/episodes_over_bound/stuck"] == len(failed)
        assert runner.failure_scalars()["rollout/stuck_plugin_calls"] == 1  # its thread still waits
        logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("episode dropped")]
        assert len(logged) == len(failed) and "release.wait(LONG)" in logged[0]
        assert ["where it was" in line for line in logged] == [True] + [False] * (len(logged) - 1)  # stack once
        if who == "orchestra":
            assert [r.failure is None for r in results] == [True, False, True]
    finally:
        release.set()
    _until(lambda: runner.failure_scalars()["rollout/stuck_plugin_calls"] == 0)  # the abandoned thread ends


class _Blocking(RecordingService):
    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def call_batch(self, requests):
        self.release.wait(LONG)
        return super().call_batch(requests)


class _WithReferee(TwoTurns):
    """p1's episode asks the scripted referee first."""

    agents = ("a", "b", "ref")

    def run(self, problem):
        if problem.uid == "p1":
            yield AgentTurn("ref", [{"role": "user", "content": "judge"}])
        return (yield from super().run(problem))


def _until(condition, timeout_s: float = 60.0) -> None:
    """Poll `condition`; the deadline only bounds a test that would hang (a condition that holds returns at once)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.timeout(60)
def test_a_call_blocked_past_its_episodes_deadline_ends_it_as_late():
    release = threading.Event()
    runner = _runner(Misbehaves("sleeps", release), _bounds(timeout_s=0.5, call_timeout_s=20))
    try:
        results = runner.run(_requests(2))
    finally:
        release.set()
    assert "OverBound: did not end within rollout.episode_timeout_s=0.5 s; blocked at test_episode_bounds.py:" \
        in results[1].outcome.dropped
    # the driver waited for it: so did e0, whose time ran out meanwhile
    assert runner.failure_scalars()["rollout/episodes_over_bound/time"] == 2


@pytest.mark.timeout(60)
def test_too_many_stuck_calls_stop_the_runner_naming_the_plugin():
    release = threading.Event()
    # a call bound of 1 s, not less: every call but the blocked one must return within it on a loaded machine too,
    # or a second stuck call would stop the first run
    runner = _runner(Misbehaves("sleeps", release), _bounds(call_timeout_s=1.0, max_stuck_calls=1))
    try:
        runner.run(_requests(2))  # one stuck call: it goes on
        with pytest.raises(EpisodeFailures, match=r"2 plugin calls are stuck in threads they were abandoned in "
                                                  r"\(rollout.max_stuck_plugin_calls=1\).*the last: orchestra "
                                                  "'Misbehaves'"):
            runner.run(_requests(2))
    finally:
        release.set()


@pytest.mark.timeout(60)
def test_an_evaluation_episode_past_its_bound_counts_wrong():
    runner = _runner(Misbehaves("forever"), _bounds())
    problems = [Problem(f"p{i}", "q", "1") for i in range(4)]
    assert heldout_accuracy(runner, problems)["accuracy"] == 0.75  # TwoTurns rewards 1; p1 never ends: 0


def test_plugin_code_runs_in_the_plugin_thread_or_inline_where_bound_to_the_driver():
    seen = []

    class Where(TwoTurns):
        def run(self, problem):
            seen.append(threading.current_thread())
            return (yield from super().run(problem))

    _runner(Where()).run(_requests(1))
    _runner(Where(), _bounds(call_timeout_s=0)).run(_requests(1))
    inline = Where()
    inline.driver_thread = True  # e.g. the external system: its program is bound to the driver's thread
    _runner(inline).run(_requests(1))
    assert seen[0] is not threading.current_thread() and seen[1:] == [threading.current_thread()] * 2


def test_the_plugin_thread_hands_back_results_and_errors_and_abandons_a_stuck_call():
    plugins, release = PluginThread(), threading.Event()
    assert plugins.call(sum, [1, 2], deadline=time.monotonic() + 5) == 3
    with pytest.raises(ZeroDivisionError):
        plugins.call(lambda: 1 / 0, deadline=time.monotonic() + 5)
    with pytest.raises(Stuck) as stuck:
        plugins.call(release.wait, LONG, deadline=time.monotonic() + 0.2)
    assert stuck.value.stack[-1].name == "wait" and plugins.stuck == 1
    assert plugins.call(sum, [3], deadline=time.monotonic() + 5) == 3  # a fresh thread
    release.set()
    _until(lambda: plugins.stuck == 0)


def test_a_slow_plugin_call_is_logged_with_its_stack_while_it_is_waited_for(caplog):
    """Under a long bound (600 s by default) a call that blocks is said at once (60 s in), not at its end; its
    stack once per place."""
    def nap():
        time.sleep(0.3)

    plugins = PluginThread(slow_after_s=0.1)
    with caplog.at_level(logging.WARNING, logger="drmas.episodes.plugin_thread"):
        for _ in range(2):
            assert plugins.call(nap, deadline=time.monotonic() + 5) is None
    first, second = [r.getMessage() for r in caplog.records]
    assert first.startswith("a plugin call has been running for 0.1 s (abandoned in ")
    place = "at test_episode_bounds.py:"
    assert place in first and "time.sleep(0.3)" in first.split("\n", 1)[1]  # the stack
    assert place in second and "\n" not in second  # the stack once
