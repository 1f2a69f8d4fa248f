"""The search system end to end on `configs/search_smoke.yaml`: a tiny model primed on the search formats plays
router, searcher and answerer over BM25 on the generated multi-hop world; a colocated run trains every agent
and `drmas eval` scores its checkpoint (avg@k / pass@k plus searches per episode)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from drmas.cli import main as drmas_main
from drmas.runtime.metrics import read_metrics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SEARCH_SMOKE = ROOT / "configs" / "search_smoke.yaml"
AGENTS = ("router", "searcher", "answerer")


def test_search_smoke_trains_all_three_agents_and_its_checkpoint_evaluates(tmp_path):
    run_dir = tmp_path / "run"
    assert drmas_main(["run", "--config", str(SEARCH_SMOKE), "trainer.steps=2", "eval.n_problems=0",
                       f"trainer.output_dir={run_dir}", "logging.tensorboard=false"]) == 0
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["loss/policy"]) and math.isfinite(r["grad_norm/policy"])
    seen = {a for r in records for a in AGENTS if f"reward/{a}/mean" in r}
    assert "router" in seen and "answerer" in seen  # the searcher speaks only when the router says "no"
    # the primed model writes the routing format, so validity (and with it the reward) varies
    assert max(r["valid/router"] for r in records) > 0 and max(r["grad_norm/policy"] for r in records) > 0

    ckpt = run_dir / "checkpoints" / "step_2"
    eval_dir = tmp_path / "eval"
    assert drmas_main(["eval", "--config", str(SEARCH_SMOKE), "--checkpoint", str(ckpt), "eval.k=2",
                       "eval.max_questions=3", f"trainer.output_dir={eval_dir}", "logging.tensorboard=false"]) == 0
    (evaluation,) = (eval_dir / "evals").iterdir()  # a directory of its own, named by the checkpoint
    assert evaluation.name.startswith("step_2-k2-")
    report = json.loads((evaluation / "eval.json").read_text())
    scores = report["benchmarks"]["multihop"]
    assert scores["k"] == 2 and scores["n_questions"] == 3
    assert 0 <= scores["avg@k"] <= scores["pass@k"] <= 1
    behaviour = report["behaviour"]["multihop"]
    assert behaviour["agents"]["router"]["calls_per_episode"] > 0
    assert "searches" in behaviour["info"]
