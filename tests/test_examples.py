"""The example systems of examples/ (plugins outside the package that import `drmas.api` only): their shipped
configs (SmolLM2) trained end to end with a tiny model, code_review in the async pipeline (buffer, learner and
rollout processes; its sandbox in the rollout and the launcher) and debate in the colocated loop, each then scored
by `drmas eval` from the run's checkpoint; their rewards per agent on scripted replies (code_review's with the
real sandbox); the shipped task file against its generator and the sandbox; and their settings' checks.
(That examples import nothing of drmas but drmas.api: tests/test_plugins.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from test_launcher import ASYNC

from drmas.api.testing import ScriptedSystem
from drmas import assembly
from drmas.cli import main
from drmas.config import ConfigError
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CODE_REVIEW = ROOT / "examples" / "code_review" / "code_review.yaml"
DEBATE = ROOT / "examples" / "debate" / "debate.yaml"
# the shipped configs' SmolLM2 replaced by the smoke run's tiny model; two steps of two groups of four; one torch thread
# (several threads on a busy 2-core machine made a colocated step 50 s instead of 4 s)
TINY = ["models.policy.builtin=tiny", "models.policy.tiny.prime_steps=200", "models.policy.optim.lr=1e-3",
        "rollout.group_size=4", "rollout.prompts_per_step=2", "algorithm.micro_batch_size=16", "trainer.steps=2",
        "trainer.checkpoint_interval=0", "trainer.threads=1", "eval.n_problems=2", "logging.tensorboard=false"]
# primed on code blocks and asserts (with made-up function names): its tester's asserts parse now and then, so
# the tester's rewards vary and a gradient flows; its coder never names the task's function (reward 0 - penalty)
CODE_TINY = [*TINY, "models.policy.tiny.prime_system=code", "agents.coder.max_new_tokens=32",
             "agents.tester.max_new_tokens=32", "system.sandbox.workers=2"]
# sums of numbers up to 6, which the math-primed tiny model writes (as configs/stability.yaml: 36 distinct sums,
# so fewer held-out problems than the shipped 200)
DEBATE_TINY = [*TINY, "rollout.max_new_tokens=16", "task.max_value=6", "task.operations=+", "task.n_test=16",
               "task.answer_extraction=flexible"]
EVAL = ["eval.k=2", "eval.max_questions=2", "logging.progress_bar=false"]


def _eval(config: Path, overrides: list[str], run: Path, out: Path) -> dict:
    """`drmas eval` of the run's final checkpoint; its report (`evals/step_<N>-k<k>-<digest>/eval.json`)."""
    assert main(["eval", "--config", str(config), "--checkpoint", str(run), *overrides, *EVAL,
                 f"trainer.output_dir={out}"]) == 0
    (report,) = (out / "evals").glob("step_2-k2-*/eval.json")
    return json.loads(report.read_text())


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_code_review_trains_in_the_async_pipeline_and_drmas_eval_scores_it(tmp_path):
    """The sandbox runs in the rollout process (the episodes' checks) and the launcher (held-out accuracy);
    each step trains coder and tester on their own rewards; `drmas eval` runs the checks again."""
    run = tmp_path / "run"
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", str(CODE_REVIEW), *CODE_TINY, *ASYNC,
                    f"trainer.output_dir={run}"], timeout=500, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out accuracy after training" in done.stdout
    records = read_metrics(run / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for agent in ("coder", "tester"):
        assert all(r[f"calls/{agent}"] == 8 for r in records), records  # 2 groups x 4 episodes, one turn each
    report = _eval(CODE_REVIEW, CODE_TINY, run, tmp_path / "eval")
    behaviour = report["behaviour"]["code_tasks"]
    assert set(behaviour["agents"]) == {"coder", "tester"} and behaviour["episodes"] == 4
    assert behaviour["info"]["programs"] >= 1  # every episode ran at least the hidden tests in the sandbox
    assert report["benchmarks"]["code_tasks"]["n_questions"] == 2


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_debate_trains_colocated_and_drmas_eval_scores_it(tmp_path):
    run = tmp_path / "run"
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", str(DEBATE), *DEBATE_TINY,
                    f"trainer.output_dir={run}"], timeout=350, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [r for r in read_metrics(run / "metrics.jsonl") if "loss/policy" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for agent, calls in (("solver_1", 16), ("solver_2", 16), ("judge", 8)):  # two rounds each, one verdict
        assert all(r[f"calls/{agent}"] == calls for r in steps), steps
    report = _eval(DEBATE, DEBATE_TINY, run, tmp_path / "eval")
    behaviour = report["behaviour"]["arithmetic"]
    assert set(behaviour["agents"]) == {"solver_1", "solver_2", "judge"}
    assert {"solvers_agree", "judge_approved", "best_solver"} <= set(behaviour["info"])


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_code_review_trains_colocated_too(tmp_path):
    """The other loop for each example (the tests above score each with `drmas eval` once): the sandbox in the
    colocated run's own process, both agents trained every step."""
    run = tmp_path / "run"
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", str(CODE_REVIEW), *CODE_TINY,
                    "eval.n_problems=0", f"trainer.output_dir={run}"], timeout=350, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [r for r in read_metrics(run / "metrics.jsonl") if "loss/policy" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["calls/coder"] == 8 and r["calls/tester"] == 8 for r in steps), steps


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_debate_trains_in_the_async_pipeline_too(tmp_path):
    run = tmp_path / "run"
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", str(DEBATE), *DEBATE_TINY, *ASYNC,
                    "eval.n_problems=0", f"trainer.output_dir={run}"], timeout=500, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = read_metrics(run / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for agent, calls in (("solver_1", 16), ("solver_2", 16), ("judge", 8)):
        assert all(r[f"calls/{agent}"] == calls for r in records), records


# --------------------------------------------------------------------- rewards per agent, on scripted replies


GOOD = "Here it is:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a * b\n```"


@pytest.mark.parametrize(("replies", "rewards", "valid", "info"), [
    # asserts that pass on the reference and one fails on the wrong solution (a - b): the tester's full reward
    ([GOOD, "```python\nassert add(1, 2) == 3\nassert add(0, 0) == 0\n```"], {"coder": 1.0, "tester": 1.0},
     [True, True], {"tester_catches": 1.0, "asserts": 2, "programs": 3}),
    # sound but catching nothing (0 - 0 == 0 + 0): system.sound_reward
    ([GOOD, "assert add(0, 0) == 0"], {"coder": 1.0, "tester": 0.2}, [True, True], {"tester_sound": 1.0}),
    # an assert the reference fails: 0, and the coder's reward is still the hidden tests'
    ([GOOD, "```python\nassert add(1, 2) == 4\n```"], {"coder": 1.0, "tester": 0.0}, [True, True],
     {"tester_sound": 0.0}),
    # a wrong function passes 1 of the 5 hidden tests (0 * 0 == 0 + 0): the share of them
    ([WRONG, "```python\nassert add(2, 2) == 4\n```"], {"coder": 0.2, "tester": 1.0}, [True, True],
     {"hidden_passed": 0.2}),
    # no code, no asserts: invalid turns; the hidden tests still run (the sandbox reports the SyntaxError)
    ([r"The answer is \boxed{7}.", "<verify>approve</verify>"], {"coder": 0.0, "tester": 0.0}, [False, False],
     {"code_loads": 0.0, "asserts": 0, "programs": 1}),
    # code that defines another function than the task's: an invalid coder turn
    (["```python\ndef plus(a, b):\n    return a + b\n```", "assert 1 == 1"], {"coder": 0.0, "tester": 0.2},
     [False, True], {"code_loads": 1.0}),
])
def test_code_review_rewards_coder_by_hidden_tests_and_tester_by_catching_the_wrong_solution(
        replies, rewards, valid, info):
    with ScriptedSystem(CODE_REVIEW) as system:  # drmas.api.testing: the example's own config, no model
        problem = next(p for p in system.problems() if p.uid == "code-add")
        played = system.play(replies, problem)
    outcome = played.outcome
    # what each turn trains on: its agent's reward, minus the config's format penalty where invalid
    penalty = system.cfg.algorithm.invalid_penalty
    assert played.rewards == pytest.approx([rewards[t.agent] - (0 if t.valid else penalty) for t in outcome.turns])
    assert outcome.agent_rewards == pytest.approx(rewards)
    assert [turn.valid for turn in outcome.turns] == valid
    assert outcome.reward == float(rewards["coder"] == 1.0)
    assert {key: outcome.info[key] for key in info} == info


def test_code_review_sends_a_coder_failing_the_testers_asserts_back_with_the_failures():
    with ScriptedSystem(CODE_REVIEW, ["system.revisions=1"]) as system:
        problem = next(p for p in system.problems() if p.uid == "code-add")
        transcript = system.play([WRONG, "```python\nassert add(1, 2) == 3\n```", GOOD], problem)
    revision = transcript.asked[-1]
    assert revision.agent == "coder"
    assert "assert add(1, 2) == 3  # AssertionError" in revision.messages[-1]["content"]
    outcome = transcript.outcome
    assert outcome.info["revisions"] == 1 and outcome.info["programs"] == 6 and outcome.reward == 1.0
    assert outcome.agent_rewards == {"coder": 1.0, "tester": 1.0}


@pytest.mark.parametrize(("judge", "rewards", "judge_valid"), [
    ("3 is right. <verify>approve</verify>", {"solver_1": 1.0, "solver_2": 0.0, "judge": 1.0}, True),  # solver 1's
    ("<verify>reject</verify>", {"solver_1": 1.0, "solver_2": 0.0, "judge": 0.0}, True),  # solver 2's: wrong
    (r"\boxed{3}", {"solver_1": 1.0, "solver_2": 0.0, "judge": 0.0}, False),  # no verdict: picks nothing
])
def test_debate_rewards_solvers_by_their_answers_and_the_judge_by_its_pick(judge, rewards, judge_valid):
    with ScriptedSystem(DEBATE) as system:
        problem = next(p for p in system.problems() if p.answer == "3")
        replies = [r"\boxed{3}", r"\boxed{5}", r"1 + 2 = 3, \boxed{3}", r"I agree with 4: \boxed{4}", judge]
        transcript = system.play(replies, problem)
    assert [turn.agent for turn in transcript.asked] == ["solver_1", "solver_2", "solver_1", "solver_2", "judge"]
    # round 2: each solver reads its own and the other's round-1 reply, not the other's round-2 reply
    assert r"Another solver's answer:" in transcript.asked[3].messages[-1]["content"]
    seen = transcript.asked[3].messages[-1]["content"].split("Another solver's answer:")[1]
    assert r"\boxed{3}" in seen and "1 + 2 = 3" not in seen
    judge_prompt = transcript.asked[4].messages[-1]["content"]
    assert "Solver 1:\n1 + 2 = 3, \\boxed{3}" in judge_prompt and "Solver 2:\nI agree with 4" in judge_prompt
    outcome = transcript.outcome
    assert outcome.agent_rewards == rewards and outcome.reward == rewards["judge"]
    assert [turn.valid for turn in outcome.turns] == [True, True, True, True, judge_valid]


# ------------------------------------------------------------------------------------- task file and settings


def _make_tasks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tasks", ROOT / "examples" / "code_review" / "make_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_tasks_are_the_generators_and_each_wrong_solution_fails_a_hidden_test_in_the_sandbox():
    make_tasks = _make_tasks()
    records = make_tasks.build()
    assert make_tasks.TASKS_FILE.read_text() == make_tasks.render(records)  # regenerate: make_tasks.py --verify
    assert len(records) == 46 and sum(r["split"] == "test" for r in records) == 9
    assert make_tasks.verify(records) == []


@pytest.mark.parametrize(("line", "message"), [
    ('{"id": "x"}', r"tasks\.jsonl:2: missing entry_point, prompt, reference, wrong, tests"),
    ('{"id": "x", "entry_point": "f", "prompt": "p", "reference": "r", "wrong": "w", "tests": []}',
     r"tasks\.jsonl:2: tests must be a non-empty list"),
    ('{"id": "add", "entry_point": "f", "prompt": "p", "reference": "r", "wrong": "w", "tests": ["assert 1"]}',
     r"tasks\.jsonl:2: id 'add' appears twice"),
    ("not json", r"tasks\.jsonl:2: invalid JSON"),
])
def test_a_bad_task_file_is_named_with_its_key_and_line(tmp_path, line, message):
    shipped = (ROOT / "examples" / "code_review" / "tasks.jsonl").read_text().splitlines()
    path = tmp_path / "tasks.jsonl"
    path.write_text(shipped[0] + "\n" + line + "\n")
    cfg = assembly.load_config(CODE_REVIEW, [f"task.path={path}"])
    with pytest.raises(ValueError, match=r"^task\.path: .*" + message):
        assembly.build_task(cfg)


@pytest.mark.parametrize(("overrides", "message"), [
    (["system.sandbox.timeout_s=0"], "system.sandbox.timeout_s: must be a number > 0, got 0"),
    (["system.sandbox.workerz=2"], "unknown config key 'system.sandbox.workerz' (did you mean 'system.sandbox.workers'?)"),
    (["system.coder_reward=most"], "system.coder_reward: 'most' is not one of fraction, all"),
    (["task.path=/nowhere/tasks.jsonl"], "task.path: no such file: /nowhere/tasks.jsonl"),
])
def test_the_code_review_settings_and_its_embedded_sandbox_section_are_checked(overrides, message):
    with pytest.raises(ConfigError) as err:
        assembly.load_config(CODE_REVIEW, overrides)
    assert message in str(err.value)


def test_config_keys_lists_the_embedded_sandbox_section(capsys):
    assert main(["config", "keys", "--config", str(CODE_REVIEW)]) == 0
    out = capsys.readouterr().out
    assert "system.sandbox.timeout_s = 10.0\n    [code_review] Wall-clock limit of one program" in out
