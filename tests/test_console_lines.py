"""What the console says each step and at the end: no nan for an agent without calls, no spike against 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from drmas.runtime.metrics import agent_line, spike_summary


def test_an_agent_without_calls_in_a_step_says_so_instead_of_printing_nan():
    scalars = {"reward/solver/mean": 0.25, "advantage/solver/sq_mean": 0.9, "valid/solver": 1.0,
               "loss/policy": -0.01, "grad_norm/policy": 0.5}
    line = agent_line(3, scalars, ["solver", "reviser"], ["policy", "frozen"])
    assert "nan" not in line
    assert "solver: r=+0.250 A2=0.90 valid=1.00" in line
    assert "reviser: no calls" in line and "frozen: no update" in line


def test_a_gradient_after_steps_without_one_is_not_a_spike():
    # a step whose groups all had equal rewards has no gradient (norm 0): it sets no scale
    assert spike_summary([0.0, 0.0, 1.0, 1.1, 0.9])["spikes"] == 0
    assert spike_summary([0.0, 1.0, 0.0, 1.2])["spikes"] == 0
    # a real spike still counts, against the earlier non-zero norms
    summary = spike_summary([1.0, 0.0, 1.2, 5.0])
    assert summary["spikes"] == 1 and summary["max"] == 5.0


def test_the_launchers_own_progress_bars_are_off_when_its_output_goes_to_a_file():
    """`drmas run > log` drew the GGUF conversion's bar in the launcher itself: tqdm reads TQDM_DISABLE once, at
    import, and the CLI's parser had imported it before the CLI turned the bars off."""
    smoke = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
    code = (f"from drmas.cli import main; main(['config', 'show', '--config', {str(smoke)!r}]); "
            "from tqdm.auto import tqdm; list(tqdm(range(3), desc='a bar'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "a bar" not in done.stderr
