"""Device audit: the engine, the weight path, the learner, priming, model building and evaluation with
their model on a device that is not the CPU (`tests/simulated_device.py`), where a tensor made on the CPU
that meets the model's raises as it would on CUDA. One subprocess runs every check (the simulated device is
registered process-wide); each test reports one check, with its traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

AUDIT = Path(__file__).resolve().parent / "device_audit.py"
CHECKS = ["mechanism_catches_device_mixing", "engine_on_device_matches_cpu", "engine_decode_step_reads_the_device_once",
          "weights_from_a_device_learner_into_a_device_engine", "learner_update_on_device",
          "sequence_logprobs_on_device", "priming_on_device", "tiny_model_built_on_its_device", "evaluation_on_device"]


@pytest.fixture(scope="module")
def audit(tiny_model_dir: Path) -> dict[str, str]:
    proc = subprocess.run([sys.executable, str(AUDIT), str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("AUDIT ")]
    assert proc.returncode == 0 and lines, f"the audit process failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("AUDIT "))


@pytest.mark.parametrize("name", CHECKS)
def test_device_audit(audit: dict[str, str], name: str) -> None:
    assert audit.get(name) == "ok", audit.get(name, f"check {name} did not run")


def test_every_audit_check_is_listed(audit: dict[str, str]) -> None:
    assert sorted(audit) == sorted(CHECKS)
