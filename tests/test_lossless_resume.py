"""Lossless resume: a pipeline whose processes are killed with `kill -9` trains the same prompts as one that is not.

Two hand-started pipelines on the smoke config, synchronous (max_staleness=0, one rollout: an uninterrupted run
trains draws 2k-2 and 2k-1 at step k), the same seed: the reference runs through; the other loses its rollout
after step 1, its buffer after step 2, its learner after step 3 (checkpoints every 2 steps: step 3 is lost with
it) and all three at once after step 5, each restarted at once (the learner with trainer.resume=true). Both
learners' `prompts.jsonl` (the draws and problem uids each step trained, per agent) must hold the same multiset; the
buffers' journals (`buffer/draws.jsonl`, appended by every buffer process of a run) say how many draws each
kill sent back to be drawn again, and the logs say so too.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from pipeline_harness import SMOKE, Processes, pipeline_overrides, smoke_model  # noqa: F401

from drmas.runtime.metrics import read_metrics

STEPS = 6
PROMPTS_PER_STEP = 2  # configs/smoke.yaml
KILLS = (("rollout", 1), ("buffer", 2), ("learner", 3), ("all", 5))  # what is killed after which step
BUDGET_S = 420

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


class Pipeline:
    """buffer, learner and rollout-0 of one run, started by hand; each can be killed and started again."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.out = tmp / name
        self.procs = Processes(tmp)
        self.name = name
        self.overrides = [*pipeline_overrides(self.out, 0, STEPS), "pipeline.groups_in_flight=2",
                          "pipeline.buffer.producer_timeout_s=2", "pipeline.buffer.request_timeout_s=3",
                          "trainer.checkpoint_interval=2"]
        self.starts: Counter[str] = Counter()
        self.deadline = time.monotonic() + BUDGET_S

    def start(self, role: str) -> None:
        self.starts[role] += 1
        name = f"{self.name}-{role}-{self.starts[role]}"
        config = ["--config", str(SMOKE)]
        if role == "buffer":
            self.procs.start(name, "drmas.buffer.main", *config, *self.overrides)
        elif role == "rollout":
            self.procs.start(name, "drmas.rollout.main", *config, "--index", "0", *self.overrides)
        else:
            resume = ["trainer.resume=true"] if self.starts[role] > 1 else []
            self.procs.start(name, "drmas.learner.main", *config, "--model", "policy", *self.overrides, *resume)

    def current(self, role: str) -> str:
        return f"{self.name}-{role}-{self.starts[role]}"

    def kill(self, roles: tuple[str, ...]) -> None:
        for role in roles:
            self.procs.kill9(self.current(role))

    def wait_for_step(self, step: int) -> None:
        metrics = self.out / "learner-policy" / "metrics.jsonl"
        while time.monotonic() < self.deadline:
            records = read_metrics(metrics) if metrics.exists() else []
            if records and records[-1]["step"] >= step:
                return
            if self.procs.procs[self.current("learner")].poll() is not None:
                pytest.fail(f"the learner exited before step {step}\n{self.procs.tails()}")
            time.sleep(0.2)
        pytest.fail(f"the learner did not reach step {step} in time\n{self.procs.tails()}")

    def finish(self) -> None:
        learner = self.procs.procs[self.current("learner")]
        try:
            assert learner.wait(max(self.deadline - time.monotonic(), 1)) == 0, self.procs.tails()
        except subprocess.TimeoutExpired:
            pytest.fail(f"the learner did not finish in time\n{self.procs.tails()}")
        assert self.procs.stop(self.current("rollout"), 15) == 0, self.procs.tails()
        assert self.procs.stop(self.current("buffer"), 15) == 0, self.procs.tails()

    def log(self, role: str, nth: int) -> str:
        return (self.procs.log_dir / f"{self.name}-{role}-{nth}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smoke_model):  # noqa: F811
    """Both pipelines side by side (the reference is synchronous and has one rollout: what it trains does not
    depend on how fast it runs), the killed one driven through `KILLS`."""
    tmp = tmp_path_factory.mktemp("resume")
    reference, killed = Pipeline(tmp, "reference"), Pipeline(tmp, "killed")
    killed_at = []
    start = time.monotonic()
    try:
        for run in (reference, killed):
            for role in ("buffer", "rollout", "learner"):
                run.start(role)
        for what, step in KILLS:
            killed.wait_for_step(step)
            roles = ("rollout", "learner", "buffer") if what == "all" else (what,)
            killed.kill(roles)
            killed_at.append((what, time.time()))
            for role in ("buffer", "learner", "rollout"):
                if role in roles:
                    killed.start(role)
        reference.finish()
        killed.finish()
    finally:
        reference.procs.kill_all()
        killed.procs.kill_all()
    print(f"\nboth runs: {time.monotonic() - start:.0f} s")
    return reference, killed, killed_at


def _trained(run: Pipeline) -> list[dict]:
    with open(run.out / "learner-policy" / "prompts.jsonl") as fh:
        return [json.loads(line) for line in fh]


def _by_agent(records: list[dict]) -> Counter:
    """(agent, draw, problem uid) of every part trained, counted."""
    uid = {d: p for r in records for d, p in zip(r["draws"], r["prompts"])}
    return Counter((agent, d, uid[d]) for r in records for agent, draws in r["agents"].items() for d in draws)


def _journal(run: Pipeline) -> list[dict]:
    with open(run.out / "buffer" / "draws.jsonl") as fh:
        return [json.loads(line) for line in fh]


def _issued(run: Pipeline) -> list[dict]:
    return [event for event in _journal(run) if event["event"] == "issue"]


def test_an_uninterrupted_run_trains_the_drawing_order_step_by_step(runs) -> None:
    reference, _, _ = runs
    records = _trained(reference)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["draws"] for r in records] == [[2 * k, 2 * k + 1] for k in range(STEPS)]
    assert all(len(r["prompts"]) == PROMPTS_PER_STEP for r in records)
    assert sum(len(e["again"]) for e in _issued(reference)) == 0


def test_runs_killed_with_kill_9_train_the_same_prompts(runs) -> None:
    reference, killed, killed_at = runs
    expected, records = _trained(reference), _trained(killed)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # every step once, none lost or doubled
    # no prompt lost, none trained twice, agent by agent (a draw drawn again for one agent trains only it)
    trained = _by_agent(records)
    assert trained == _by_agent(expected)
    assert {d for r in records for d in r["draws"]} == {d for r in expected for d in r["draws"]}

    # how many draws each kill sent back to be drawn again: draws handed out again after it, before the next
    issued = _issued(killed)
    seen: set[int] = set()
    redrawn: Counter[str] = Counter()
    bounds = [*killed_at, ("end", float("inf"))]
    for event in issued:
        kill = next((what for (what, t), (_, t_next) in zip(bounds, bounds[1:]) if t <= event["time"] < t_next),
                    None)
        again = [d for d in event["draws"] if d in seen]
        seen.update(event["draws"])
        if kill is not None:
            redrawn[kill] += len(again)
        else:
            assert not again, event  # nothing is drawn twice before the first kill
    lost = sum((_by_agent(expected) - trained).values())
    given_up = [e for e in _journal(killed) if e["event"] == "give_up"]
    print("\nkill -> draws drawn again:", dict(redrawn), "| lost:", lost, "| given up:", len(given_up))
    assert not given_up  # crashes and the staleness bound never give a draw up (only a prompt's own faults)
    # a learner killed one step past its checkpoint loses that step's draws (drawn again); so does a kill of
    # every process. Groups in flight when the rollout or the buffer dies are drawn again too, and after a
    # learner restart groups generated on the weights it no longer has (dropped stale or orphaned)
    assert redrawn["learner"] >= PROMPTS_PER_STEP and redrawn["all"] >= PROMPTS_PER_STEP
    # and no more than what was in flight: a step trained past the checkpoint, plus the groups_in_flight=2
    # groups generated meanwhile (before: a group whose solver part was orphaned and verifier part trained gave
    # its budget back, and rollouts started groups on the killed learner's weights: 7 to 10 for the learner)
    in_flight = {"rollout": 2, "buffer": 2, "learner": 2 + PROMPTS_PER_STEP, "all": 2 + PROMPTS_PER_STEP}
    assert all(redrawn[kind] <= n for kind, n in in_flight.items()), redrawn
    # and each is said where it happens
    assert "trained past the checkpoint the learner of policy resumed from" in killed.log("buffer", 2)
    assert "an earlier buffer of this run handed them out" in killed.log("buffer", 3)


def test_a_resume_under_another_seed_is_refused(runs) -> None:
    """The draws a checkpoint holds are places in its run's order: under another seed they would name other
    prompts, so the learner refuses at once, naming the key."""
    _, killed, _ = runs
    proc = killed.procs.start("killed-learner-reseeded", "drmas.learner.main", "--config", str(SMOKE), "--model",
                              "policy", *killed.overrides, "trainer.resume=true", "trainer.seed=1")
    try:
        assert proc.wait(120) == 2
    finally:
        killed.procs.kill_all()
    assert "trainer.seed=1, but the checkpoint's run drew its prompts with trainer.seed=0" in \
        (killed.procs.log_dir / "killed-learner-reseeded.log").read_text()
