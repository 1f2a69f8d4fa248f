"""`drmas run pipeline.launcher=ray` on a local Ray cluster (this CPU machine, a few logical CPUs): one run of
configs/smoke_async.yaml through which a rollout actor and a learner actor are killed, two rollouts are added
and one of them is removed again; a run of a plugin's system."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray")

from cli_run import run_cli  # noqa: E402
from pipeline_harness import smoke_async_models  # noqa: E402,F401  (a fixture)
from test_launcher import ASYNC, _Background, _gone  # noqa: E402

from drmas.runtime.metrics import read_metrics  # noqa: E402
from drmas.runtime.netsec import is_loopback_host  # noqa: E402

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
STARTED = re.compile(r"\[launcher\] started (\S+) \(pid (\d+) on \S+, actor pid (\d+)\)")
STARTED_NAMES = re.compile(r"\[launcher\] started (\S+) \(pid")
STEPS = 1000  # more than the test waits for: it stops the run once it has seen every phase


def _steps(path: Path) -> list[int]:
    return [r["step"] for r in read_metrics(path)] if path.exists() else []


class _RayRun(_Background):
    """The driver in the background (see test_launcher._Background); its pids are those of actors too."""

    def started(self) -> dict[str, list[tuple[int, int]]]:
        """name -> [(process pid, actor pid), ...] in start order."""
        found: dict[str, list[tuple[int, int]]] = {}
        for name, pid, actor in STARTED.findall(self.output()):
            found.setdefault(name, []).append((int(pid), int(actor)))
        return found

    def kill_actor(self, name: str) -> int:
        actor = self.started()[name][-1][1]
        os.kill(actor, signal.SIGKILL)
        return actor

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the driver stops its actors and its Ray
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for starts in self.started().values():
            for pid, actor in starts:
                for p in (pid, actor):
                    if not _gone(p):
                        os.kill(p, signal.SIGKILL)


@pytest.mark.timeout(600)
def test_ray_run_survives_dead_actors_and_follows_added_and_removed_rollouts(tmp_path, smoke_async_models):
    """Every phase follows an event of the run, never a race against it: the run has more steps than the test
    needs (it would take many minutes to finish them), so a slow `drmas rollouts` command (a Ray client start
    takes seconds on a loaded machine) cannot arrive after the end, and it is stopped as a user stops one
    (SIGTERM: rollouts first, learners write their checkpoints, exit 130) once all was seen."""
    out = tmp_path / "run"
    name = f"drmas-test-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke_async.yaml"),
               f"trainer.output_dir={out}", *ASYNC, "pipeline.launcher=ray", "pipeline.ray.num_cpus=8",
               "pipeline.ray.host=node",  # endpoints on the node's address, as across nodes: CURVE keys for the run
               f"pipeline.ray.control_name={name}", f"trainer.steps={STEPS}", "trainer.checkpoint_interval=1",
               "trainer.keep_checkpoints=2", "pipeline.restarts.backoff_s=0.5", "pipeline.buffer.producer_timeout_s=3"]
    solver = out / "learner-solver_model" / "metrics.jsonl"
    verifier = out / "learner-verifier_model" / "metrics.jsonl"
    run = _RayRun(tmp_path, command)
    try:
        run.wait_for(lambda: "rollout-1" in run.started(), "every process started", timeout=150)
        address = re.search(r"Ray cluster at (\S+)", run.output()).group(1)

        def rollouts(action: str, count: int) -> None:
            done = run_cli([sys.executable, "-m", "drmas.cli", "rollouts", action, str(count), "--address", address,
                            "--name", name], timeout=120, cwd=ROOT)
            assert done.returncode == 0 and f"requested: {action} {count}" in done.stdout, done.stdout + done.stderr

        rollouts("add", 2)
        run.wait_for(lambda: len(_steps(solver)) >= 1, "learner step 1", timeout=150)
        first_rollout = run.kill_actor("rollout-0")
        run.wait_for(lambda: re.search(r"\[rollout-0\] .*rollout-0 joined tcp://",  # "" until it was lost
                                       run.output().partition("rollout-0 was lost with its host")[2]),
                     "rollout-0 restarted and joined", timeout=150)
        run.wait_for(lambda: len(_steps(verifier)) >= 2, "verifier step 2", timeout=150)
        killed_at = max(_steps(verifier))
        run.kill_actor("learner-verifier_model")
        rollouts("remove", 1)  # the newest, rollout-3, while the learner is restarted
        run.wait_for(lambda: max(_steps(verifier)) >= killed_at + 2, "two verifier steps after its restart",
                     timeout=240)
        added = out / "rollout-2" / "metrics.jsonl"
        run.wait_for(lambda: added.exists() and any(r.get("throughput/rollout/episodes_per_s", 0) > 0
                                                    for r in read_metrics(added)),
                     "episodes from the added rollout-2", timeout=150)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(120) == 130, run.output()[-4000:]
    finally:
        run.cleanup()
    output = run.output()
    started = run.started()
    assert set(started) == {"buffer", "learner-solver_model", "learner-verifier_model",
                            "rollout-0", "rollout-1", "rollout-2", "rollout-3"}
    assert "adding 2 rollout(s) on request" in output and "removing rollout-3 on request" in output
    assert len(started["rollout-3"]) == 1  # removed, not restarted
    # the killed rollout: replaced by a new actor that re-joined the learners (weights) and produced again
    assert "rollout-0 was lost with its host: restarting it in 0.5 s (restart 1 of 3)" in output
    assert len(started["rollout-0"]) == 2 and started["rollout-0"][1][1] != first_rollout
    # the killed learner: resumed from its checkpoint, its steps go on without a gap
    assert "learner-verifier_model was lost with its host: restarting it in 0.5 s (restart 1 of 3)" in output
    assert re.search(r"\[learner-verifier_model\] .*resumed from \S+ at version \d+", output), output[-3000:]
    for path in (solver, verifier):
        steps = _steps(path)
        assert set(steps) == set(range(1, max(steps) + 1)) and max(steps) < STEPS, steps
    # stopped as a user stops a run: every process went, the learners with a checkpoint of where they were
    assert "SIGTERM received: stopping every process" in output and "run ended with code 130" in output
    # the local launcher's outputs: a directory per process with its log, the resolved config, the summary
    for proc in set(started) - {"rollout-3"}:  # the removed one may have been stopped while it was loading
        assert f"[{proc}] " in output and "INFO" in (out / proc / "process.log").read_text()
    config = (out / "config.yaml").read_text()
    assert config.count(":0\n") == 0
    node = re.search(r"started buffer \(pid \d+ on (\S+),", output).group(1)
    assert f"producer_endpoint: tcp://{node}:" in config
    if not is_loopback_host(node):  # every process got the run's keys (the buffer refuses to listen without)
        assert "endpoints are not loopback: CURVE keys for this run" in output
        assert "curve_client_secret_file: " + str(out / "keys") in config
    assert all(_gone(p) for starts in started.values() for pair in starts for p in pair)


@pytest.mark.timeout(300)
def test_ray_run_that_cannot_be_placed_stops_with_the_reason(tmp_path, smoke_async_models):
    """A learner asking for a GPU on a CPU-only cluster: the run ends (exit 2) naming what it could not place,
    instead of waiting for resources that never come. (The local Ray gets its default size: enough CPUs for
    every process, whatever this machine's cores.)"""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke_async.yaml"),
               f"trainer.output_dir={out}", *ASYNC, "pipeline.launcher=ray",
               f"pipeline.ray.control_name=drmas-test-{uuid.uuid4().hex[:8]}", "pipeline.ray.learner_gpus_per_rank=1",
               "pipeline.ray.placement_timeout_s=3"]
    done = run_cli(command, timeout=240, cwd=ROOT)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "learner-solver_model: no node of the Ray cluster has {'CPU': 1.0, 'GPU': 1.0} free" in done.stderr
    assert "pipeline.ray.placement_timeout_s=3" in done.stderr and "started" not in done.stdout


@pytest.mark.timeout(180)
def test_a_lost_host_is_replaced_without_holding_up_supervision():
    """While Ray cannot place a replacement host yet (no free CPU), asking whether it is placed returns at
    once, so the supervisor goes on watching every other process; once room appears it is placed; one that
    never gets room ends with the reason after the placement timeout. (Before, the supervision round
    blocked for up to pipeline.ray.placement_timeout_s.)"""
    import ray

    from drmas.config import read_config
    from drmas.launch.ray_launcher import RayChild, RayLauncher, _Host
    from drmas.launch.supervisor import PlacementError

    cfg = read_config(ROOT / "configs" / "smoke_async.yaml",
                      ["pipeline.launcher=ray", "pipeline.ray.cpus_per_process=1",
                       "pipeline.ray.placement_timeout_s=60"])
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False,
             namespace=f"drmas-test-{uuid.uuid4().hex[:8]}")
    try:
        launcher = RayLauncher(cfg)
        blocker = _Host.options(num_cpus=1).remote("blocker")  # holds the cluster's only CPU
        ray.get(blocker.where.remote(), timeout=60)
        child = RayChild("rollout-0", "rollout", "drmas.rollout.main", ["--index", "0"], launcher=launcher, lost=True)
        start = time.monotonic()
        assert [child.placed() for _ in range(5)] == [False] * 5
        assert time.monotonic() - start < 2.0  # asked, not waited for
        ray.kill(blocker)
        deadline = time.monotonic() + 60
        while not child.placed():
            assert time.monotonic() < deadline, "the replacement host was never placed"
            time.sleep(0.1)
        assert ray.get(child.host.where.remote(), timeout=30)[1] > 0 and not child.lost
        launcher.ray_cfg.placement_timeout_s = 1.0  # the CPU is child's now: a second host never gets room
        other = RayChild("rollout-1", "rollout", "drmas.rollout.main", ["--index", "1"], launcher=launcher, lost=True)
        with pytest.raises(PlacementError, match=r"rollout-1: the Ray cluster could not place and start it within 1 s"):
            while not other.placed():
                time.sleep(0.1)
        child.close()
    finally:
        ray.shutdown()


@pytest.mark.timeout(420)
def test_ray_run_of_a_plugin_system(tmp_path):
    """The plugin system of tests/fixtures/plugins (named by a path relative to its config) trained through
    Ray: the driver imports it before validating the config, every process its host starts imports it from the
    config it was handed (the file is sent along; on this one machine the host finds it at the same path)."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config",
               str(ROOT / "tests" / "fixtures" / "plugins" / "toy.yaml"), f"trainer.output_dir={out}", *ASYNC,
               "pipeline.launcher=ray", "pipeline.ray.num_cpus=4", "eval.n_problems=0",
               f"pipeline.ray.control_name=drmas-test-{uuid.uuid4().hex[:8]}"]
    done = run_cli(command, timeout=360, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(STARTED_NAMES.findall(done.stdout)) == {"buffer", "learner-policy", "rollout-0"}
    records = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all("reward/proposer/mean" in r and "reward/checker/mean" in r for r in records)
    assert "training finished" in done.stdout
