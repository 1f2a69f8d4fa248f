"""bench/stability.py end to end for two steps of one mode: the colocated loop really trains, the recorded
calls feed the statistics, and under `global` the measured E[A^2] equals the paper's formula per agent (the
figures of the table in docs/stability.md come from exactly this path)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("stability_bench", ROOT / "bench" / "stability.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["stability_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_two_global_steps_give_every_figure(tmp_path) -> None:
    bench = _bench()
    run = bench.train_one(str(ROOT / "configs" / "stability.yaml"), "global", 0, 2,
                          ["eval.n_problems=2", "logging.tensorboard=false"], str(tmp_path / "run"))
    assert run["steps"] == 2 and set(run["accuracy"]) == {"before", "after"}
    # the held-out report carries the system's info means (math_revise: attempts per episode, >= 1) and validity
    after = run["heldout"]["after"]
    assert after["accuracy"] == run["accuracy"]["after"] and 1 <= after["info/attempts"] <= 2
    assert 0 <= after["valid/solver"] <= 1 and 0 <= after["info/revised"] <= 1
    assert set(run["agents"]) == {"solver", "reviser"} and set(run["models"]) == {"solver_model", "reviser_model"}
    for agent, figures in run["agents"].items():
        assert figures["calls_per_step"] > 0
        if figures["measured_calls"]:
            assert figures["measured"] == pytest.approx(figures["predicted"], rel=1e-4)
    assert run["agents"]["solver"]["calls_per_step"] == 16  # 2 prompts x 8 episodes, one solver call each
    assert all(math.isfinite(g) for g in run["series"]["grad_norm"]["solver_model"])
    assert len(run["series"]["reward"]) == len(run["series"]["sq_mean"]["reviser"]) == 2
    summary = bench.aggregate([run])
    table = bench.markdown({"summary": summary, "meta": {"setting": "tiny", "config": "c", "seeds": [0], "steps": 2,
                                                         "wall_s": run["wall_s"], "jobs": 1, "commit": "x"}})
    assert "| `global` | reviser |" in table and "| `global` | solver_model |" in table

    # the figures come out with or without matplotlib (the `bench` extra): its absence costs only the plot
    result = {"summary": summary, "runs": [run], "meta": {"setting": "tiny", "config": "c", "seeds": [0], "steps": 2,
                                                         "wall_s": run["wall_s"], "jobs": 1, "commit": "x"}}
    bench.write_outputs(result, tmp_path, tmp_path / "stability.png")
    assert (tmp_path / "stability.json").is_file() and "| `global` |" in (tmp_path / "stability.md").read_text()
    assert (tmp_path / "stability.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


def test_the_debate_setting_loads_its_plugin_and_the_formula_holds_with_per_agent_rewards(tmp_path) -> None:
    """The `debate` setting (a plugin system from examples/, rewards per agent): under `global` each call
    carries its episode's mean reward, and the formula still equals the advantages the learner computes."""
    bench = _bench()
    run = bench.train_one(str(ROOT / bench.SETTINGS["debate"]["config"]), "global", 0, 1,
                          ["eval.n_problems=1", "logging.tensorboard=false"], str(tmp_path / "run"))
    assert run["steps"] == 1 and set(run["models"]) == {"solver_model", "judge_model"}
    calls = {agent: figures["calls_per_step"] for agent, figures in run["agents"].items()}
    assert calls == {"solver_1": 32, "solver_2": 32, "judge": 16}  # 2 prompts x 8 episodes x (2 rounds | 1 pick)
    # up to eps (1e-6 added to the std): episode scores here (means of 5 calls, -0.02 per invalid one) have stds
    # near 0.01, where eps shows in the fourth digit
    for figures in run["agents"].values():
        assert figures["measured_calls"] and figures["measured"] == pytest.approx(figures["predicted"], rel=1e-3)
    assert all(math.isfinite(g) for g in run["series"]["grad_norm"]["judge_model"])


def _drive(orchestra, problem, replies: list[str]):
    """Run one episode of `orchestra` on scripted replies (one per agent turn, in order); its outcome."""
    episode = orchestra.run(problem)
    turn, sent = next(episode), []
    try:
        for reply in replies:
            sent.append(turn.agent)
            turn = episode.send(reply)
    except StopIteration as done:
        return sent, done.value
    raise AssertionError(f"the episode asked for more than {len(replies)} replies")


@pytest.mark.parametrize("answer, verdict, solver, verifier, valid", [
    ("Ana has 8. \\boxed{8}", "8 is right. <verify>approve</verify>", 1.0, 0.1, True),
    ("Ana has 8. \\boxed{8}", "8 is wrong. <verify>reject</verify>", 1.0, 0.0, True),
    ("Ana has 3. \\boxed{3}", "3 is wrong. <verify>reject</verify>", 0.0, 0.1, True),
    ("Ana has 3. \\boxed{3}", "3 is right. <verify>approve</verify>", 0.0, 0.0, True),
    # no verdict is never a right one, whatever the answer (it cannot earn the reject's reward by saying nothing)
    ("Ana has 3. \\boxed{3}", "I am not sure.", 0.0, 0.0, False),
])
def test_lookup_credit_rewards_each_agent_for_its_own_work(answer, verdict, solver, verifier, valid) -> None:
    from drmas.api import ORCHESTRAS, TASKS, Problem
    from drmas.assembly import load_plugins

    load_plugins(ROOT / "configs" / "stability_lookup.yaml")
    settings_cls = ORCHESTRAS.settings.get("lookup_credit")
    orchestra = ORCHESTRAS.get("lookup_credit")(settings_cls(), {"lookup_solver": "s", "lookup_verifier": "v"},
                                                TASKS.get("lookup")(TASKS.settings.get("lookup")()))
    problem = Problem("p", "Sam has 3 pens, Ana has 8 pens and Leo has 5 pens. How many pens does Ana have?", "8")
    sent, outcome = _drive(orchestra, problem, [answer, verdict])
    assert sent == ["s", "v"] and outcome.reward == solver
    assert outcome.agent_rewards == {"s": solver, "v": verifier}
    assert [t.valid for t in outcome.turns] == [True, valid] and outcome.info["verdict_right"] == float(verifier > 0)
