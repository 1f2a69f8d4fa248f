"""Issue 33, defect 2: a plugin episode that never ends, or blocks, is bounded. A real plugin file (written here,
beside the toy system of tests/fixtures/plugins) whose orchestra, on one question, asks for turns forever or blocks in
`time.sleep` (or whose scripted referee or calculator service blocks), trained on the smoke run's tiny model in the
colocated loop and in the async pipeline: the run trains its steps; that question's episodes are dropped, logged once
with where the plugin was, and counted (`rollout/episodes_over_bound/<reason>`). The runner's side of it, with a
scripted engine: tests/test_episode_bounds.py."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from test_plugin_failures import _config, _train, toy_with

from drmas.runtime.metrics import read_metrics

pytestmark = pytest.mark.e2e

STUCK = '''
"""The toy system, misbehaving on one question: its episode never ends (it asks the proposer, the scripted referee or
the calculator again and again), or its orchestra, referee or calculator blocks in time.sleep."""
import time
from dataclasses import dataclass

from drmas.api import AGENT_ROLES, ORCHESTRAS, AgentTurn, ServiceCall, SystemSettings, TeamContext, help_field
from toy_mas import Calculator, Referee, ToyOrchestra, ToySettings

SETTINGS = []  # the orchestra's (the referee is built without them)


@dataclass
class StuckSettings(ToySettings):
    name: str = SystemSettings.name_field("stuck")
    loops_on: str = help_field("", "Question whose episode never ends.")
    loop_with: str = help_field("proposer", "What it asks for again and again: proposer, referee or calc.")
    blocks_on: str = help_field("", "Question on which the blocker blocks.")
    blocker: str = help_field("orchestra", "Who blocks: orchestra, referee or calc.")
    sleep_s: float = help_field(30.0, "How long it blocks.")


def blocks(who, question):
    return SETTINGS[-1].blocker == who and question == SETTINGS[-1].blocks_on


class SleepyCalculator(Calculator):
    def call_batch(self, requests):
        if any(blocks("calc", f"What is {a} + {b}?") for a, b in requests):  # the sums task's questions
            time.sleep(SETTINGS[-1].sleep_s)
        return super().call_batch(requests)


@AGENT_ROLES.register("stuck_referee")
class StuckReferee(Referee):
    role = "stuck_referee"

    def respond(self, turn):
        if blocks("referee", turn.messages[-1]["content"]):  # a scripted role's prompt: the question
            time.sleep(SETTINGS[-1].sleep_s)
        return super().respond(turn)


@ORCHESTRAS.register("stuck", settings=StuckSettings)
class StuckOrchestra(ToyOrchestra):
    def __init__(self, settings, agents_by_role, task):  # the referee agent plays stuck_referee
        super().__init__(settings, {**agents_by_role, "referee": agents_by_role["stuck_referee"]}, task)
        self.services = {"calc": SleepyCalculator()}
        SETTINGS.append(settings)

    def run(self, problem):
        s = self.settings
        while problem.question == s.loops_on:
            if s.loop_with == "calc":
                yield ServiceCall("calc", [1, 1])
            elif s.loop_with == "referee":
                yield AgentTurn(self.names["referee"], [{"role": "user", "content": "again"}], state="again")
            else:
                yield from self._turn("proposer", problem, TeamContext(), [])
        if blocks("orchestra", problem.question):
            time.sleep(s.sleep_s)
        return (yield from super().run(problem))
'''


@pytest.fixture(scope="module")
def stuck_config(tmp_path_factory) -> Path:
    return toy_with(tmp_path_factory.mktemp("stuck"), "stuck", STUCK)


def _dropped(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("episode dropped")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("loop_with", "bound", "expected"), [
    ("referee", "", "at agent 'referee' failed in episode s0-g0-e0: OverBound: asked for agent turn 1025, past "
                    "rollout.max_episode_turns=1024"),
    ("calc", "", "at service 'calc' failed in episode s0-g0-e0: OverBound: asked for service call 1025, past "
                 "rollout.max_episode_tool_calls=1024"),
    ("proposer", "rollout.max_episode_turns=8", "at agent 'proposer' failed in episode s0-g0-e0: OverBound: asked for "
                                                "agent turn 9, past rollout.max_episode_turns=8"),
])
def test_an_orchestra_asking_for_turns_forever_is_dropped_at_its_bound_and_the_run_trains(
    stuck_config, tmp_path, caplog, loop_with, bound, expected
):
    """The issue's run: 3 colocated steps, and draw 0's orchestra asks forever for its scripted referee's turns or
    its calculator (under the default bounds) or its proposer's (the model's: generated, so a smaller bound)."""
    cfg, q = _config(stuck_config, tmp_path, "system.loops_on={q0}", f"system.loop_with={loop_with}",
                     "trainer.steps=3", "rollout.prompts_per_step=2", *[bound] * bool(bound), system="stuck")
    reason = "tool_calls" if loop_with == "calc" else "turns"
    with caplog.at_level(logging.WARNING, logger="drmas.episodes.failures"):
        records = _train(cfg)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["rollout/groups_dropped"] == 1 and records[0][f"rollout/episodes_over_bound/{reason}"] == 4
    assert records[-1]["rollout/episodes_failed"] == records[-1][f"rollout/episodes_over_bound/{reason}"]
    assert records[0]["calls/checker"] == 4  # the other group trained
    logged = _dropped(caplog)
    assert logged[0].startswith(f"episode dropped: orchestra 'StuckOrchestra' {expected}")
    assert "where it was" in logged[0] and "stuck_mas.py" in logged[0]  # its generator's stack, with the first
    assert len(logged) == records[-1]["rollout/episodes_failed"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("blocker", "plugin"), [
    ("orchestra", "orchestra 'StuckOrchestra'"), ("referee", "scripted agent 'referee'"),
    ("calc", "service 'calc' at call_batch")])
def test_plugin_code_blocking_in_time_sleep_costs_its_episodes_and_the_run_trains(
    stuck_config, tmp_path, caplog, blocker, plugin
):
    """A call past `rollout.plugin_call_timeout_s` is abandoned: its episodes are dropped (for the calculator,
    every episode of its batch), and the step goes on without them."""
    cfg, q = _config(stuck_config, tmp_path, "system.blocks_on={q0}", f"system.blocker={blocker}",
                     "system.sleep_s=4", "rollout.plugin_call_timeout_s=0.5", "rollout.max_stuck_plugin_calls=8",
                     "trainer.steps=2", "rollout.prompts_per_step=2", system="stuck")
    with caplog.at_level(logging.WARNING, logger="drmas.episodes.failures"):
        records = _train(cfg)
    assert [r["step"] for r in records] == [1, 2]
    stuck = records[-1]["rollout/episodes_over_bound/stuck"]
    assert stuck >= 1 and records[-1]["rollout/episodes_failed"] == stuck
    assert records[0]["rollout/groups_dropped"] >= 1
    logged = _dropped(caplog)
    assert len(logged) == stuck and all(plugin in line for line in logged)
    assert "a plugin call did not return within rollout.plugin_call_timeout_s=0.5 s and was abandoned in its " \
           "thread; blocked at stuck_mas.py:" in logged[0]
    assert "time.sleep(" in logged[0] and "where it was" in logged[0]  # its stack, with the first drop


@pytest.mark.timeout(400)
def test_episodes_that_never_end_or_block_are_dropped_and_reported_in_the_async_pipeline(stuck_config, tmp_path):
    """`drmas run` with pipeline.mode=async: draw 0's episodes ask for turns forever, draw 1's block in the
    orchestra. The rollout drops them (logged in its process.log, counted), abandons their groups at the buffer
    (it draws them again), and the learner trains its steps on the others."""
    from cli_run import run_cli
    from test_launcher import ASYNC

    _, q = _config(stuck_config, tmp_path, system="stuck")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(stuck_config), f"trainer.output_dir={out}",
               "eval.n_problems=0", "system.name=stuck", "trainer.steps=3", "rollout.max_new_tokens=8",
               f"system.loops_on={q['q0']}", f"system.blocks_on={q['q1']}", "system.sleep_s=3",
               "rollout.max_episode_turns=16", "rollout.plugin_call_timeout_s=0.5",
               "rollout.max_stuck_plugin_calls=64", *ASYNC]
    done = run_cli(command, timeout=360, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "learner-policy" / "metrics.jsonl")] == [1, 2, 3]
    last = read_metrics(out / "rollout-0" / "metrics.jsonl")[-1]
    assert last["rollout/episodes_over_bound/turns"] >= 1 and last["rollout/episodes_over_bound/stuck"] >= 1
    assert last["rollout/dropped_episodes"] == last["rollout/episodes_failed"]
    assert read_metrics(out / "buffer" / "metrics.jsonl")[-1]["buffer/draws/redrawn"] >= 1  # abandoned: drawn again
    log = (out / "rollout-0" / "process.log").read_text()
    assert log.count(" dropped: ") == last["rollout/episodes_failed"]  # one line per dropped episode
    assert "OverBound: asked for agent turn 17, past rollout.max_episode_turns=16" in log
    assert "OverBound: a plugin call did not return within rollout.plugin_call_timeout_s=0.5 s" in log
    assert log.count("where it was") == 2  # the stack of each, once
