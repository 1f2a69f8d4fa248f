"""A plugin that fails costs its episode, never the run: a real plugin file (written here, beside the toy
system of tests/fixtures/plugins) whose orchestra raises on one question, whose service raises on one request and
whose scripted referee raises on one question, trained in the colocated loop on the smoke run's tiny model.
The other groups train; the failure is logged once and counted (`rollout/episodes_failed`); and a plugin that
fails every episode stops the run after `rollout.max_consecutive_episode_failures`, naming itself and its error.
(The async pipeline with such a plugin: test_a_failing_plugin_costs_its_episodes_in_the_async_pipeline.)"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import pytest

from drmas import assembly
from drmas.colocated import ColocatedRun
from drmas.episodes.failures import EpisodeFailures
from drmas.runtime.metrics import read_metrics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "tests" / "fixtures" / "plugins" / "toy.yaml"
TOY_PLUGIN = ROOT / "tests" / "fixtures" / "plugins" / "toy_mas.py"

FLAKY = '''
"""The toy system, failing where its settings say: the orchestra on one question, the calculator service on
one question's request, the scripted referee on one question (or every one: '*')."""
from dataclasses import dataclass

from drmas.api import AGENT_ROLES, ORCHESTRAS, ScriptedRole, ServiceCall, SystemSettings, TeamContext, help_field
from toy_mas import ToyOrchestra, ToySettings

SERVICE_BATCHES = []  # every batch the calculator was called with (the test reads it)
REFEREE_CALLS = [0]


@dataclass
class FlakySettings(ToySettings):
    name: str = SystemSettings.name_field("flaky")
    orchestra_fails_on: str = help_field("", "Question on which the orchestra raises.")
    service_fails_on: str = help_field("", "Question whose calculator request raises.")
    referee_fails_on: str = help_field("", "Question on which the referee raises ('*': every one).")
    referee_fails_first: int = help_field(0, "Calls of the referee (in this process) that raise, first ones.")


class FlakyCalculator:
    def __init__(self, fails_on):
        self.fails_on = fails_on

    def call_batch(self, requests):
        SERVICE_BATCHES.append([question for question, _ in requests])
        if any(question == self.fails_on for question, _ in requests):
            raise ConnectionError(f"calculator lost its connection on {self.fails_on!r}")
        return [sum(operands) for _, operands in requests]


@AGENT_ROLES.register("flaky_referee")
class FlakyReferee(ScriptedRole):
    role = "flaky_referee"

    def respond(self, turn):
        correct, question, fails_on, fails_first = turn.state
        REFEREE_CALLS[0] += 1
        if fails_on in ("*", question) or REFEREE_CALLS[0] <= fails_first:
            raise KeyError(f"no rule for {question!r}")
        return "right" if correct else "wrong, try again"


@ORCHESTRAS.register("flaky", settings=FlakySettings)
class FlakyOrchestra(ToyOrchestra):
    def __init__(self, settings, agents_by_role, task):  # the referee agent plays flaky_referee
        super().__init__(settings, {**agents_by_role, "referee": agents_by_role["flaky_referee"]}, task)
        self.services = {"calc": FlakyCalculator(settings.service_fails_on)}

    def run(self, problem):
        if problem.question == self.settings.orchestra_fails_on:
            yield from self._turn("proposer", problem, TeamContext(), [])
            raise ValueError(f"cannot orchestrate {problem.question!r}")
        inner = super().run(problem)
        request = next(inner)
        while True:
            if isinstance(request, ServiceCall):
                reply = yield ServiceCall("calc", (problem.question, request.request))
            elif request.agent == self.names["referee"]:
                state = (request.state, problem.question, self.settings.referee_fails_on,
                         self.settings.referee_fails_first)
                reply = yield type(request)(request.agent, request.messages, state=state)
            else:
                reply = yield request
            try:
                request = inner.send(reply)
            except StopIteration as stop:
                return stop.value
'''


@pytest.fixture(scope="module")
def flaky_config(tmp_path_factory) -> Path:
    """toy.yaml with the flaky system; one plugin file per test process (a module name is imported once)."""
    return toy_with(tmp_path_factory.mktemp("flaky"), "flaky", FLAKY)


def toy_with(where: Path, name: str, source: str) -> Path:
    """toy.yaml loading, beside the toy system, the plugin `source` (as `<name>_mas.py` in `where`), whose role
    `<name>_referee` plays the referee."""
    (where / f"{name}_mas.py").write_text(source)
    config = where / f"{name}.yaml"
    config.write_text(TOY.read_text().replace("plugins: [./toy_mas.py]", f"plugins: [{TOY_PLUGIN}, ./{name}_mas.py]")
                      .replace("referee: {role: referee}", f"referee: {{role: {name}_referee}}"))
    return config


def _config(config: Path, tmp_path: Path, *overrides: str, system: str = "flaky"):
    """The flaky run (or `system`'s); `overrides` may name `{q0}`... `{q3}`: the questions of the run's first four
    draws (step 1's groups at prompts_per_step=4)."""
    base = [f"trainer.output_dir={tmp_path / 'run'}", "logging.tensorboard=false", "eval.n_problems=0",
            f"system.name={system}", "trainer.steps=1", "rollout.prompts_per_step=4", "rollout.max_new_tokens=8"]
    cfg = assembly.load_config(config, base)
    order = assembly.drawing_order(cfg, assembly.build_task(cfg))
    questions = {f"q{i}": order.at(i).question for i in range(4)}
    assert len(set(questions.values())) == 4, questions
    return assembly.load_config(config, [*base, *(o.format(**questions) for o in overrides)]), questions


def _train(cfg) -> list[dict]:
    ColocatedRun(cfg, log=lambda *_: None).run()
    return read_metrics(Path(cfg.trainer.output_dir) / "metrics.jsonl")


def test_plugins_failing_on_one_question_each_drop_its_group_and_the_step_trains_on_the_rest(
    flaky_config, tmp_path, caplog
):
    """Step 1 has four groups: the orchestra raises on the first's question, the service on the second's request,
    the scripted referee on the third's; the fourth trains."""
    cfg, q = _config(flaky_config, tmp_path, "system.orchestra_fails_on={q0}", "system.service_fails_on={q1}",
                     "system.referee_fails_on={q2}")
    sys.modules["flaky_mas"].SERVICE_BATCHES.clear()
    with caplog.at_level(logging.WARNING, logger="drmas.episodes.failures"):
        (record,) = _train(cfg)
    assert record["rollout/groups_dropped"] == 3 and record["rollout/episodes_failed"] == 12
    # the step trained on the one whole group: 4 episodes, each one checker call
    assert record["calls/checker"] == 4 and record["calls/proposer"] >= 4 and math.isfinite(record["loss/policy"])
    dropped = sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("episode dropped"))
    expected = sorted(
        [f"episode dropped: orchestra 'FlakyOrchestra' at agent 'proposer' failed in episode s0-g0-e{e}: "
         f"ValueError: cannot orchestrate {q['q0']!r}" for e in range(4)]
        + [f"episode dropped: service 'calc' at call_batch failed in episode s0-g1-e{e}: ConnectionError: "
           f"calculator lost its connection on {q['q1']!r}" for e in range(4)]
        + [f"episode dropped: scripted agent 'referee' failed in episode s0-g2-e{e}: KeyError: "
           f"\"no rule for {q['q2']!r}\"" for e in range(4)])
    assert dropped == expected
    tracebacks = [r for r in caplog.records if r.getMessage().startswith("episode dropped") and r.exc_info]
    assert len(tracebacks) == 3  # once per distinct error
    # the service's batch raised, then each request went alone: only the second group's requests failed
    batches = sys.modules["flaky_mas"].SERVICE_BATCHES
    mixed = [i for i, batch in enumerate(batches) if q["q1"] in batch and len(set(batch)) > 1]
    assert mixed, batches
    for i in mixed:
        assert batches[i + 1 : i + 1 + len(batches[i])] == [[question] for question in batches[i]], batches


def test_a_plugin_failing_every_episode_stops_the_run_naming_itself(flaky_config, tmp_path):
    cfg, _ = _config(flaky_config, tmp_path, "system.referee_fails_on=*", "rollout.max_consecutive_episode_failures=3")
    with pytest.raises(EpisodeFailures, match="3 episodes in a row failed and none ended well "
                                              r"\(rollout.max_consecutive_episode_failures=3\); the last: scripted "
                                              "agent 'referee' failed in episode s0-g.-e.: KeyError: .no rule for"):
        _train(cfg)


@pytest.mark.timeout(300)
def test_a_failing_plugin_costs_its_episodes_in_the_async_pipeline(flaky_config, tmp_path):
    """`drmas run` with pipeline.mode=async: the rollout process drops the episodes of the question its
    orchestra fails on, and the one episode whose referee call is the process's first (its group's other
    episodes may have been sent: the rollout abandons the group, the buffer drops that part at once), logged
    once each in its process.log and counted; it keeps generating and the learner trains its steps on the
    other groups."""
    from cli_run import run_cli
    from test_launcher import ASYNC

    _, q = _config(flaky_config, tmp_path)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(flaky_config), f"trainer.output_dir={out}",
               "eval.n_problems=0", "system.name=flaky", "trainer.steps=2", "rollout.max_new_tokens=8",
               f"system.orchestra_fails_on={q['q0']}", "system.referee_fails_first=1", *ASYNC]
    done = run_cli(command, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "learner-policy" / "metrics.jsonl")] == [1, 2]
    rollout = read_metrics(out / "rollout-0" / "metrics.jsonl")
    assert rollout[-1]["rollout/episodes_failed"] >= 5  # draw 0's group (and its draws again, if any), 1 more
    assert rollout[-1]["rollout/dropped_episodes"] == rollout[-1]["rollout/episodes_failed"]
    log = (out / "rollout-0" / "process.log").read_text()
    assert "episode dropped: orchestra 'FlakyOrchestra' at agent 'proposer' failed in episode" in log
    assert f"ValueError: cannot orchestrate {q['q0']!r}" in log
    assert log.count("episode dropped: scripted agent 'referee' failed in episode") == 1
    assert log.count(" dropped: ") == rollout[-1]["rollout/episodes_failed"]  # one line per dropped episode
