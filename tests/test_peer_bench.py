"""bench/peer.py runs in its --quick forms (the tiny model, 2 steps: the numbers mean nothing) and writes
well-formed figures; TRL is told the same problems and prompts as drmas (checked by token ids inside the bench);
the report's statistics are checked on hand-built runs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("peer", ROOT / "bench" / "peer.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _quick(what: str, out: Path) -> str:
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "peer.py"), what, "--quick", "--out", str(out),
                             "logging.tensorboard=false"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its own session: a timeout takes its workers too
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    return output


@pytest.mark.e2e
@pytest.mark.timeout(960)  # 4 runs, ~70 s in all on a quiet machine; minutes on a loaded one
def test_quick_parity_trains_both_on_the_same_prompts(tmp_path) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "parity"
    _quick("parity", out)
    result = json.loads((out / "peer.json").read_text())
    runs = {(r["framework"], r["seed"]): r for r in result["runs"]}
    assert set(runs) == {("drmas", 0), ("drmas", 1), ("trl", 0), ("trl", 1)}
    for run in runs.values():
        assert run["steps"] == 2 and len(run["reward"]) == 2 and all(0 <= x <= 1 for x in run["reward"])
        assert all(t > 0 for t in run["tokens"]) and run["peak_rss_mb"] > 100
        assert run["prompt_ids_match"]
    for seed in (0, 1):  # the same problems in the same order, from drmas's drawing order for the seed
        assert runs[("drmas", seed)]["prompts"] == runs[("trl", seed)]["prompts"]
    assert runs[("drmas", 0)]["prompts"] != runs[("drmas", 1)]["prompts"]
    summary = result["summary"]
    assert summary["steps"] == 2 and summary["prompt_ids_match"] and summary["same_prompts"]
    assert "| drmas |" in (out / "peer.md").read_text()
    assert (out / "peer.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


@pytest.mark.e2e
@pytest.mark.timeout(960)
def test_quick_speed_compares_three_runs_to_trl(tmp_path) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "speed"
    output = _quick("speed", out)
    result = json.loads((out / "peer_speed.json").read_text())
    figures = result["summary"]
    assert set(figures) == {"drmas", "drmas_async", "trl"}
    for name, f in figures.items():
        assert f["steps_timed"] == 1 and f["samples_per_s"] > 0 and f["tokens_per_s"] > 0, (name, f)
        assert f["peak_rss_mb"] > 100
    assert figures["trl"]["ratio_samples"] == 1.0
    assert "drmas_async/trl: samples/s = " in output


@pytest.mark.e2e
@pytest.mark.timeout(960)
def test_quick_grad_computes_both_frameworks_loss_on_the_same_batch(tmp_path) -> None:
    """`grad` on the tiny model: both frameworks score drmas's batch, with the same log-probs and loss (its
    rewards rarely vary, so the gradients may both be zero; the SmolLM2 figures are in docs/benchmarks.md)."""
    _quick("grad", tmp_path)
    (run,) = json.loads((tmp_path / "peer_grad.json").read_text())["runs"]
    assert run["samples"] == 16 and run["logp_max_abs_diff"] < 1e-4
    assert run["loss"]["drmas"] == pytest.approx(run["loss"]["trl"], abs=1e-6)
    assert run["grad_norm"]["drmas"] == pytest.approx(run["grad_norm"]["trl"], rel=1e-3, abs=1e-7)
    assert "| 0 | 16 (" in (tmp_path / "peer_grad.md").read_text()


def test_intervals_and_parity_table_on_hand_built_runs() -> None:
    bench = _bench()
    one = bench.interval([0.5])
    assert one["mean"] == 0.5 and math.isnan(one["low"])
    three = bench.interval([0.2, 0.4, 0.6])
    assert three["mean"] == pytest.approx(0.4) and three["high"] - three["mean"] == pytest.approx(4.303 * 0.2 / 3 ** 0.5)

    def run(framework, seed, reward):
        return {"framework": framework, "seed": seed, "steps": len(reward), "reward": reward, "prompts": ["a", "b"],
                "prompt_ids_match": True}

    runs = [run("drmas", 0, [0.1, 0.3]), run("drmas", 1, [0.2, 0.4]),
            run("trl", 0, [0.1, 0.2]), run("trl", 1, [0.9, 1.0])]
    table, summary = bench.parity_table(runs)
    assert summary["difference"]["mean"] == pytest.approx(((0.2 - 0.15) + (0.3 - 0.95)) / 2)
    assert summary["overlapping_steps"] == 2 and summary["same_prompts"]
    assert "| 2 | 0.350" in table


def test_steady_rates_leave_out_the_first_step() -> None:
    bench = _bench()
    run = {"step_seconds": [10.0, 2.0, 2.0], "samples": [16, 16, 16], "tokens": [100.0, 40.0, 60.0],
           "peak_rss_mb": 500.0}
    figures = bench.steady(run)
    assert figures["samples_per_s"] == pytest.approx(32 / 4) and figures["tokens_per_s"] == pytest.approx(100 / 4)
    async_run = {**run, "step_seconds": [math.nan, 2.0, 2.0]}  # its first step's time is unknown
    assert bench.steady(async_run)["steps_timed"] == 2
