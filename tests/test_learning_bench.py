"""bench/learning.py runs in its --quick form and writes well-formed figures (the numbers of a 2-step tiny run
mean nothing); the gain's statistics are checked on hand-built scores."""

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


def _stats():
    spec = importlib.util.spec_from_file_location("learning_stats", ROOT / "bench" / "learning_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_every_figure(tmp_path) -> None:
    out = tmp_path / "learning"
    # its own session: on a timeout the bench's worker processes go with it, not only the bench
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "learning.py"), "--quick", "--out", str(out),
                             "logging.tensorboard=false"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=600)  # < 60 s on an idle machine; a shared one is slower
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-2000:]
    result = json.loads((out / "learning.json").read_text())
    assert result["meta"]["quick"] and result["meta"]["seeds"] == [0, 1]
    for run in result["runs"]:
        n = run["before"]["n"]
        assert n == run["after"]["n"] == run["gain"]["n"] == 8 and len(run["scores"]["after"]) == n
        for when in ("before", "after"):
            assert 0 <= run[when]["low"] <= run[when]["accuracy"] <= run[when]["high"] <= 1
        assert run["steps"] == 2 and set(run["series"]["reward"]) == {"solver", "verifier"}
        assert all(len(v) == 2 and all(math.isfinite(x) for x in v) for v in run["series"]["reward"].values())
    # the model's starting weights are the same for every seed: so is the greedy score before training
    assert result["runs"][0]["scores"]["before"] == result["runs"][1]["scores"]["before"]
    # each seed's figures are kept as it finishes (a later invocation's seeds add to them)
    assert [json.loads((out / f"seed{i}" / "result.json").read_text())["seed"] for i in (0, 1)] == [0, 1]
    table = (out / "learning.md").read_text()
    assert "| 0 | solver |" in table and "| 2 |" in table
    assert (out / "learning.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


def test_paired_gain_and_wilson_interval() -> None:
    stats = _stats()
    before = [0] * 150 + [1] * 50
    after = [0] * 130 + [1] * 70  # 20 problems turned right, none wrong
    g = stats.gain(before, after)
    assert g["gain"] == pytest.approx(0.1) and g["turned_right"] == 20 and g["turned_wrong"] == 0
    # paired SE: std of the differences (20 ones, 180 zeros) / sqrt(n), below the unpaired one
    assert g["se_paired"] == pytest.approx(math.sqrt(0.1 * 0.9 * 200 / 199) / math.sqrt(200))
    assert g["se_paired"] < g["se_unpaired"] == pytest.approx(math.sqrt(0.25 * 0.75 / 200 + 0.35 * 0.65 / 200))
    low, high = stats.wilson(50, 200)
    assert low == pytest.approx(0.1951, abs=1e-4) and high == pytest.approx(0.3143, abs=1e-4)
    assert stats.wilson(0, 8)[0] == 0.0
    with pytest.raises(ValueError):
        stats.gain([1, 0], [1])


def test_t_quantile_matches_student_t() -> None:
    t95 = _stats().t95
    # two-sided 95% quantiles of Student's t with n - 1 degrees of freedom (published tables)
    for n, exact in ((2, 12.706), (3, 4.303), (11, 2.228), (12, 2.201), (21, 2.086), (31, 2.042), (121, 1.980)):
        assert t95(n) == pytest.approx(exact, rel=2e-3)
    assert math.isnan(t95(1))
