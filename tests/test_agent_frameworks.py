"""Agent frameworks on their defaults, trained through the gateway: examples/agent_frameworks has one two-agent
program (a solver with an `add` tool, a verifier with structured output) written with the OpenAI Agents SDK (its
default model on the Responses API, streamed runs, `output_type`) and with LangGraph (`bind_tools`, a `ToolNode`,
a streamed chat model, `with_structured_output` on the Responses API). Each trains in the colocated loop and in the
async pipeline (2 steps, stopped by the launcher without a kill); the verifier's constrained JSON always parses
(valid 1.0). Needs the `frameworks` extra (`make frameworks`); skipped without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from test_launcher import ASYNC

from drmas.runtime.metrics import read_metrics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "agent_frameworks"
FRAMEWORKS = {"sdk": "agents", "langgraph": "langgraph"}  # config -> the package it needs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_a_framework_program_trains_colocated_and_async_on_its_defaults(tmp_path, name):
    pytest.importorskip(FRAMEWORKS[name], reason="the `frameworks` extra (make frameworks)")
    config = EXAMPLES / f"{name}.yaml"
    base = [sys.executable, "-m", "drmas.cli", "run", "--config", str(config), f"system.workdir={EXAMPLES}",
            "eval.n_problems=0"]
    colocated = run_cli(base + [f"trainer.output_dir={tmp_path / 'colocated'}", "trainer.steps=1",
                                "logging.tensorboard=false"], timeout=400, cwd=tmp_path)
    assert colocated.returncode == 0, colocated.stdout[-3000:] + colocated.stderr[-3000:]
    (step,) = read_metrics(tmp_path / "colocated" / "metrics.jsonl")
    assert step["calls/solver"] > 0 and step["calls/verifier"] > 0 and step["valid/verifier"] == 1.0, step

    out = tmp_path / "async"
    done = run_cli(base + [f"trainer.output_dir={out}", "trainer.steps=2", *ASYNC], timeout=400, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ignored SIGTERM" not in done.stdout + done.stderr, done.stdout[-3000:]  # stopped, not killed
    records = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["calls/solver"] > 0 and r["calls/verifier"] > 0 and r["valid/verifier"] == 1.0 for r in records)
    assert read_metrics(out / "rollout-0" / "metrics.jsonl")[-1]["gateway/calls"] > 0
