"""`drmas eval`: avg@k / pass@k arithmetic, behaviour statistics, and the command on the smoke config."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Optional

import pytest

from drmas.evaluation.behaviour import behaviour_stats
from drmas.evaluation.command import cli, prepare, run_evaluation
from drmas.evaluation.outputs import markdown, print_report, tensorboard_scalars
from drmas.evaluation.passk import (
    avg_at_k,
    estimated_pass_at_k,
    pass_at_k,
    score_table,
    unbiased_pass_at_k,
)
from drmas.mas.base import EpisodeOutcome, TurnResult

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
BENCHMARK_KEYS = {"avg@k", "pass@k", "k", "n_questions"}


# ------------------------------------------------------------------------------------------ avg@k / pass@k


def test_avg_and_pass_at_k_on_a_hand_made_table():
    table = [[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert avg_at_k(table) == pytest.approx((0.25 + 0.0 + 1.0) / 3)
    assert pass_at_k(table) == pytest.approx(2 / 3)
    assert score_table(table) == {"avg@k": pytest.approx(1.25 / 3), "pass@k": pytest.approx(2 / 3), "k": 4,
                                  "n_questions": 3}


def test_partial_credit_counts_in_avg_but_only_exact_matches_pass():
    table = {"q1": [0.5, 1.0 - 1e-12], "q2": [0.8, 0.9]}
    assert avg_at_k(table) == pytest.approx((0.75 - 5e-13 + 0.85) / 2)
    assert pass_at_k(table) == 0.5  # 1 - 1e-12 is an exact match after float noise; 0.9 is not


@pytest.mark.parametrize(
    "table, message",
    [
        ({"q1": [1, 0], "q2": [1]}, "question q2 has 1 samples, question q1 has 2"),
        ([[1, 0], [0, 1, 1]], "question #1 has 3 samples"),
        ({"a": [0, 1.5]}, "question a sample 1 has reward 1.5"),
        ([[0.0, float("nan")]], "question #0 sample 1"),
        ([], "no questions"),
        ([[]], "has no samples"),
    ],
)
def test_bad_tables_are_rejected_naming_the_question(table, message):
    with pytest.raises(ValueError, match=message):
        score_table(table)


def _brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Share of the k-subsets of n samples (the first c successes) that hold at least one success."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(1 for s in subsets if min(s) < c), len(subsets))


def test_unbiased_pass_at_k_matches_enumeration_of_all_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = float(_brute_force_pass_at_k(n, c, k))
                assert unbiased_pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_unbiased_estimator_is_stable_for_large_n_and_equals_pass_at_k_when_n_is_k():
    exact = 1 - Fraction(math.comb(900, 100), math.comb(1000, 100))
    assert unbiased_pass_at_k(1000, 100, 100) == pytest.approx(float(exact), rel=1e-9)
    assert unbiased_pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    table = [[1, 0, 0], [0, 0, 0], [0, 1, 1]]
    assert estimated_pass_at_k(table, 3) == pytest.approx(pass_at_k(table))
    # one success in three samples: pass@1 = 1/3, pass@2 = 1 - C(2,2)/C(3,2) = 2/3
    assert estimated_pass_at_k([[1, 0, 0]], 1) == pytest.approx(1 / 3)
    assert estimated_pass_at_k([[1, 0, 0]], 2) == pytest.approx(2 / 3)


def test_unbiased_estimator_rejects_k_above_n():
    with pytest.raises(ValueError, match="k = 4 exceeds the n = 3 samples"):
        estimated_pass_at_k([[1, 0, 0]], 4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        unbiased_pass_at_k(3, 1, 0)


# ----------------------------------------------------------------------------------------------- behaviour


def _outcome(turns, info):
    return EpisodeOutcome(reward=0.0, turns=[TurnResult(agent, text, valid) for agent, text, valid in turns], info=info)


def test_behaviour_stats_per_agent_and_numeric_info_keys():
    outcomes = [
        _outcome([("solver", "abcd", True), ("verifier", "xx", False), ("solver", "ab", True)],
                 {"rounds": 2, "approved": False, "note": "ignored", "searches": 3}),
        _outcome([("solver", "abcdef", False)], {"rounds": 1, "approved": True}),
    ]
    stats = behaviour_stats(outcomes, agents=("solver", "verifier", "searcher"))
    assert stats["episodes"] == 2
    solver, verifier, searcher = (stats["agents"][a] for a in ("solver", "verifier", "searcher"))
    assert solver["calls_per_episode"] == 1.5 and solver["calls"] == 3
    assert solver["valid_share"] == pytest.approx(2 / 3)
    assert solver["mean_response_chars"] == pytest.approx(4.0)
    assert verifier["calls_per_episode"] == 0.5 and verifier["valid_share"] == 0.0
    assert searcher == {"calls_per_episode": 0.0, "valid_share": None, "calls": 0, "mean_response_chars": None}
    assert stats["info"] == {"rounds": 1.5, "approved": 0.5, "searches": 3.0}  # searches: only where reported


def test_behaviour_on_failed_episodes_says_how_often_a_wrong_answer_was_approved():
    right = EpisodeOutcome(reward=1.0, turns=[TurnResult("solver", "4", True)], info={"approved": True})
    wrong_approved = EpisodeOutcome(reward=0.0, turns=[TurnResult("solver", "5", True)], info={"approved": True})
    wrong_rejected = EpisodeOutcome(reward=0.5, turns=[TurnResult("solver", "6", True)], info={"approved": False})
    stats = behaviour_stats([right, wrong_approved, wrong_rejected, wrong_rejected])
    assert stats["info"]["approved"] == 0.5
    assert stats["info_on_failures"] == {"approved": pytest.approx(1 / 3)}  # partial credit is not a success
    report = {"benchmarks": {}, "behaviour": {"b": stats}}
    assert tensorboard_scalars(report)["eval/b/on_failures/approved"] == pytest.approx(1 / 3)


def test_the_printed_report_shows_episode_statistics_per_episode_not_as_agent_rows(capsys):
    """An episode's `info` is one number per episode, not per agent: the console report gives it a table of its
    own (mean per episode, mean per failed episode), as eval.md does, never rows under "calls / episode"."""
    right = EpisodeOutcome(reward=1.0, turns=[TurnResult("solver", "4", True)], info={"approved": True})
    wrong = EpisodeOutcome(reward=0.0, turns=[TurnResult("solver", "5", True)], info={"approved": False})
    stats = behaviour_stats([right, wrong, wrong], agents=("solver",))
    report = {"checkpoint": None, "step": 0, "sampling": {"k": 1}, "behaviour": {"test": stats},
              "benchmarks": {"test": {"n_questions": 3, "k": 1, "avg@k": 1 / 3, "pass@k": 1 / 3}}}
    print_report(report)
    out = capsys.readouterr().out
    assert "(episode)" not in out
    per_agent, per_episode = out.split("behaviour per agent")[1].split("episode statistics")
    assert "solver" in per_agent and "approved" not in per_agent
    assert "mean per episode" in per_episode and "mean per failed episode" in per_episode
    (row,) = [line for line in per_episode.splitlines() if "approved" in line]
    assert "test" in row and "0.333" in row and "0.000" in row  # approved in 1 of 3 episodes, in 0 of 2 failed
    assert "| approved | 0.333 | 0.000 |" in markdown(report)  # the same numbers as eval.md


# ------------------------------------------------------------------------------------------- the command


def _eval(out: Path, *args: str) -> int:
    return cli(["eval", "--config", str(SMOKE), *args, f"trainer.output_dir={out}", "eval.k=2", "eval.max_questions=3"])


def _evaluation(out: Path) -> Path:
    """The one evaluation directory under `out` (`evals/<what>-k<k>-<digest>`)."""
    (found,) = (out / "evals").iterdir()
    return found


def _scalars(tensorboard_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tensorboard_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_eval_on_the_smoke_config_writes_results(tmp_path):
    assert _eval(tmp_path / "eval") == 0
    out = _evaluation(tmp_path / "eval")
    assert out.name.startswith("initial-k2-")
    report = json.loads((out / "eval.json").read_text())
    assert set(report["benchmarks"]) == {"arithmetic"}
    entry = report["benchmarks"]["arithmetic"]
    assert set(entry) == BENCHMARK_KEYS
    assert isinstance(entry["avg@k"], float) and isinstance(entry["pass@k"], float)
    assert entry["k"] == 2 and entry["n_questions"] == 3
    assert 0.0 <= entry["avg@k"] <= entry["pass@k"] <= 1.0
    questions = [json.loads(line) for line in (out / "eval_questions.jsonl").read_text().splitlines()]
    assert len(questions) == 3 and all(len(q["rewards"]) == 2 for q in questions)
    assert entry["avg@k"] == pytest.approx(sum(sum(q["rewards"]) for q in questions) / 6)
    solver = report["behaviour"]["arithmetic"]["agents"]["solver"]
    assert solver["calls_per_episode"] >= 1.0 and 0.0 <= solver["valid_share"] <= 1.0
    assert "rounds" in report["behaviour"]["arithmetic"]["info"]
    assert report["checkpoint"] is None and report["step"] == 0
    assert "| arithmetic | 3 | 2 |" in (out / "eval.md").read_text()
    scalars = _scalars(out / "tensorboard")
    assert scalars["eval/arithmetic/avg@k"] == [(0, pytest.approx(entry["avg@k"]))]
    assert scalars["eval/arithmetic/pass@k"] == [(0, pytest.approx(entry["pass@k"]))]

    # same seed -> the same samples, whatever the chunking of episodes
    from drmas.config import read_config

    cfg = read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'again'}", "eval.k=2", "eval.max_questions=3",
                              "logging.tensorboard=false"])
    ev = prepare(cfg, None)
    run_evaluation(ev, questions_per_chunk=1, log=lambda _: None)
    assert ev.out.name == out.name  # the same checkpoint and settings: the same name
    again = [json.loads(line) for line in (ev.out / "eval_questions.jsonl").read_text().splitlines()]
    assert again == questions


def test_each_evaluation_has_a_directory_of_its_own_and_running_one_again_is_refused(tmp_path, capsys):
    """`drmas eval` wrote eval.json, eval.md and tensorboard/ into the training run's directory (a fifth
    TensorBoard run there); a second evaluation overwrote eval.json without a word and added a second event
    file, so TensorBoard showed each point twice."""
    from drmas.runtime.run_dir import check_output_dir

    run = tmp_path / "run"

    def one_question(*args: str) -> int:
        return cli(["eval", "--config", str(SMOKE), f"trainer.output_dir={run}", "eval.k=2", "eval.max_questions=1",
                    *args])

    assert one_question() == 0
    first = _evaluation(run)
    assert sorted(p.name for p in run.iterdir()) == ["evals"]
    assert {"eval.json", "eval.md", "eval_questions.jsonl", "eval_run.json", "tensorboard"} <= \
        {p.name for p in first.iterdir()}
    check_output_dir(run, resume=False, overwrite=False)  # evaluating first does not block training there
    capsys.readouterr()

    assert one_question() == 2  # the same evaluation again: refused, nothing rewritten
    err = capsys.readouterr().err
    assert f"{first} already holds this evaluation" in err and "eval.resume=true" in err
    assert len(list((first / "tensorboard").iterdir())) == 1

    assert one_question("eval.k_temperature=0.9") == 0  # other settings: another directory
    assert len(list((run / "evals").iterdir())) == 2
    assert one_question("eval.resume=true") == 0  # continuing the first one: its points are not doubled
    scalars = _scalars(first / "tensorboard")
    assert [step for step, _ in scalars["eval/arithmetic/avg@k"]] == [0]


def test_an_interrupted_eval_keeps_the_questions_it_finished(tmp_path):
    from drmas.config import read_config

    ev = prepare(read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'out'}", "eval.k=2", "eval.max_questions=3"]),
                 None)
    out = ev.out
    out.mkdir(parents=True)
    (out / "eval.json").write_text("{}")  # an earlier evaluation's report must not pass for this one's
    real_run, calls = ev.runner.run, []

    def run_then_interrupt(requests):
        calls.append(len(requests))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(requests)

    ev.runner.run = run_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(ev, questions_per_chunk=1, log=lambda _: None)
    lines = (out / "eval_questions.jsonl").read_text().splitlines()
    assert calls == [2, 2] and len(lines) == 1 and len(json.loads(lines[0])["rewards"]) == 2
    assert not (out / "eval.json").exists()


def _prepared(out: Path, *overrides: str):
    from drmas.config import read_config

    return prepare(read_config(SMOKE, [f"trainer.output_dir={out}", "eval.k=2", "logging.tensorboard=false",
                                       *overrides]), None)


def _counting_runs(ev, interrupt_at: int = 0) -> list[int]:
    """Count the episodes of each runner.run call; raise KeyboardInterrupt on call `interrupt_at` (1-based)."""
    real_run, calls = ev.runner.run, []

    def run(requests):
        calls.append(len(requests))
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real_run(requests)

    ev.runner.run = run
    return calls


def _without_timing(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("wall_seconds", "resumed_questions")}


def test_a_resumed_eval_samples_only_the_missing_questions_and_equals_an_uninterrupted_one(tmp_path):
    whole = run_evaluation(_prepared(tmp_path / "whole", "eval.max_questions=3"), questions_per_chunk=1,
                           log=lambda _: None)

    out = tmp_path / "cut"
    ev = _prepared(out, "eval.max_questions=3")
    _counting_runs(ev, interrupt_at=3)  # killed while the third question runs
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(ev, questions_per_chunk=1, log=lambda _: None)
    ev = _prepared(out, "eval.max_questions=3", "eval.resume=true")
    calls, said = _counting_runs(ev), []
    resumed = run_evaluation(ev, questions_per_chunk=1, log=said.append)
    assert calls == [2]  # only the third question's k=2 episodes
    assert said[0].startswith("eval.resume: 2 of 3 questions taken from")
    assert resumed["resumed_questions"] == 2
    assert _without_timing(resumed) == _without_timing(whole)  # scores and per-agent behaviour alike
    assert (ev.out / "eval_questions.jsonl").read_text() == \
        (_evaluation(tmp_path / "whole") / "eval_questions.jsonl").read_text()

    # extending the question set samples only the new questions
    ev = _prepared(out, "eval.max_questions=4", "eval.resume=true")
    calls = _counting_runs(ev)
    extended = run_evaluation(ev, questions_per_chunk=1, log=lambda _: None)
    assert calls == [2] and extended["benchmarks"]["arithmetic"]["n_questions"] == 4


def test_resume_drops_a_torn_last_line_and_starts_fresh_without_an_earlier_eval(tmp_path):
    out = tmp_path / "out"
    ev = _prepared(out, "eval.max_questions=2", "eval.resume=true")  # nothing to resume: a fresh evaluation
    assert ev.done == {}
    run_evaluation(ev, questions_per_chunk=1, log=lambda _: None)
    log = ev.out / "eval_questions.jsonl"
    first, second = log.read_text().splitlines()
    log.write_text(first + "\n" + second[: len(second) // 2])  # killed while writing the second question
    ev = _prepared(out, "eval.max_questions=2", "eval.resume=true")
    assert [uid for _, uid in ev.done] == [json.loads(first)["uid"]]


@pytest.mark.parametrize("override, key", [
    ("eval.k_temperature=0.9", "sampling.temperature"),
    ("trainer.seed=7", "sampling.seed"),
    ("agents.solver.max_new_tokens=5", "agents.solver.max_new_tokens"),
    ("retrieval.topk=5", "retrieval.topk"),
])
def test_resume_with_other_sampling_settings_is_refused_naming_them(tmp_path, capsys, override, key):
    out = tmp_path / "out"
    run_evaluation(_prepared(out, "eval.max_questions=1"), log=lambda _: None)
    code = cli(["eval", "--config", str(SMOKE), f"trainer.output_dir={out}", "eval.k=2", "eval.max_questions=1",
                "eval.resume=true", override])
    assert code == 2
    err = capsys.readouterr().err
    assert "eval.resume" in err and key in err


def test_resume_accepts_other_retriever_transport_and_thread_settings(tmp_path):
    out = tmp_path / "out"
    run_evaluation(_prepared(out, "eval.max_questions=1"), log=lambda _: None)
    ev = _prepared(out, "eval.max_questions=1", "eval.resume=true", "retrieval.retries=2", "retrieval.timeout_s=5",
                   "retrieval.max_queries_per_request=8", "trainer.threads=1")
    assert len(ev.done) == 1  # how the retriever is reached does not change what an episode samples


@pytest.mark.e2e
def test_eval_of_a_checkpoint_from_a_one_step_run(tmp_path):
    from drmas.cli import main as drmas_main

    run_dir = tmp_path / "run"
    assert drmas_main(["run", "--config", str(SMOKE), "trainer.steps=1", "eval.n_problems=0",
                       f"trainer.output_dir={run_dir}", "logging.tensorboard=false"]) == 0
    ckpt = run_dir / "checkpoints" / "step_1"
    assert (ckpt / "COMPLETE").exists()
    assert _eval(run_dir, "--checkpoint", str(ckpt)) == 0
    out = _evaluation(run_dir)
    assert out.name.startswith("step_1-k2-")
    report = json.loads((out / "eval.json").read_text())
    assert report["checkpoint"] == str(ckpt) and report["step"] == 1
    assert report["models"] == {"policy": str(ckpt / "policy")}
    assert set(report["benchmarks"]["arithmetic"]) == BENCHMARK_KEYS
    assert _scalars(out / "tensorboard")["eval/arithmetic/pass@k"][0][0] == 1  # step of the checkpoint

    # the engine serves the checkpoint's weights, not the config's initial ones
    import torch
    from safetensors.torch import load_file

    from drmas.config import read_config

    ev = prepare(read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'x'}"]), ckpt)
    saved = load_file(next((ckpt / "policy").glob("*.safetensors")))
    served = dict(ev.runner.engines["policy"].model.named_parameters())
    assert all(torch.equal(served[name].data, tensor) for name, tensor in saved.items() if name in served)

    # the colocated run directory itself resolves to its newest complete checkpoint
    by_run = prepare(read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'y'}"]), run_dir)
    assert by_run.model_dirs == {"policy": ckpt / "policy"} and by_run.step == 1
    assert by_run.model_checkpoints() == {"policy": {"checkpoint": str(ckpt), "step": 1}}


def test_missing_checkpoint_directory_exits_2_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "runs" / "checkpoints" / "step_7"
    assert _eval(tmp_path / "out", "--checkpoint", str(missing)) == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_checkpoint_without_the_trained_model_exits_2_but_a_frozen_model_loads_from_its_config(tmp_path, capsys):
    empty = tmp_path / "step_3"
    empty.mkdir()
    assert _eval(tmp_path / "out", "--checkpoint", str(empty)) == 2
    err = capsys.readouterr().err
    assert "trained model 'policy'" in err and str(empty / "policy") in err

    from drmas.config import read_config
    from drmas.models.loading import build_tiny_model

    cfg = read_config(SMOKE, ["models.policy.trainable=false", f"trainer.output_dir={tmp_path / 'out'}"])
    ev = prepare(cfg, empty)
    assert ev.model_dirs == {"policy": build_tiny_model(cfg.models["policy"].tiny)} and ev.step == 3


def test_benchmark_files_are_loaded_by_the_task_and_bad_rows_are_reported(tmp_path, capsys):
    good = tmp_path / "gsm.jsonl"
    good.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n"
                    + json.dumps({"problem": "What is 2 + 1?", "answer": 3}) + "\n")
    assert _eval(tmp_path / "out", f"eval.benchmarks={{gsm: {good}}}", "logging.tensorboard=false") == 0
    entry = json.loads((_evaluation(tmp_path / "out") / "eval.json").read_text())["benchmarks"]
    assert list(entry) == ["gsm"] and entry["gsm"]["n_questions"] == 2 and entry["gsm"]["k"] == 2

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n{not json\n")
    assert _eval(tmp_path / "out2", f"eval.benchmarks={{gsm: {bad}}}") == 2
    assert f"eval.benchmarks.gsm: {bad}:2: invalid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("override, key", [("eval.k=0", "eval.k"), ("eval.k_top_p=1.5", "eval.k_top_p"),
                                           ("eval.max_questions=-1", "eval.max_questions")])
def test_impossible_eval_settings_exit_2_naming_the_key(tmp_path, capsys, override, key):
    code = cli(["eval", "--config", str(SMOKE), f"trainer.output_dir={tmp_path}", override])
    assert code == 2
    assert key in capsys.readouterr().err


# ------------------------------------------------------------------------- --checkpoint RUN_DIR (async)

TWO_MODELS = ["pipeline.mode=async", "agents.verifier.model=judge",
              "models.judge={builtin: tiny, tiny: {hidden_size: 64, num_layers: 2, num_heads: 2, "
              "intermediate_size: 128, seed: 0, prime_steps: 200}}"]


def _async_checkpoints(run: Path, model, complete: dict[str, list[int]],
                       torn: Optional[dict[str, list[int]]] = None) -> None:
    """Write learner checkpoints the way an async run does: `<run>/learner-<m>/checkpoints/step_<N>/<m>/`
    (a torn one lacks its COMPLETE marker, as when a learner dies mid-save)."""
    from drmas.models.checkpoint import save_checkpoint

    for marked, checkpoints in ((True, complete), (False, torn or {})):
        for model_id, steps in checkpoints.items():
            for step in steps:
                path = save_checkpoint(run / f"learner-{model_id}", step, {model_id: model}, {model_id: {}},
                                       {"version": step, "model": model_id})
                if not marked:
                    (path / "COMPLETE").unlink()


def _two_model_config(out: Path, *overrides: str):
    from drmas.config import read_config

    return read_config(SMOKE, [*TWO_MODELS, f"trainer.output_dir={out}", "eval.k=2", "logging.tensorboard=false",
                               *overrides])


def test_eval_of_an_async_run_directory_takes_each_models_newest_complete_checkpoint(tmp_path, tiny_model):
    run = tmp_path / "run"
    _async_checkpoints(run, tiny_model, {"policy": [2, 3], "judge": [1, 3]}, torn={"policy": [5]})
    out = tmp_path / "eval"
    assert cli(["eval", "--config", str(SMOKE), "--checkpoint", str(run), *TWO_MODELS, f"trainer.output_dir={out}",
                "eval.k=2", "eval.max_questions=2", "logging.tensorboard=false"]) == 0
    policy_ckpt, judge_ckpt = run / "learner-policy/checkpoints/step_3", run / "learner-judge/checkpoints/step_3"
    report = json.loads((_evaluation(out) / "eval.json").read_text())
    assert report["models"] == {"policy": str(policy_ckpt / "policy"), "judge": str(judge_ckpt / "judge")}
    expected = {"policy": {"checkpoint": str(policy_ckpt), "step": 3},
                "judge": {"checkpoint": str(judge_ckpt), "step": 3}}
    assert report["model_checkpoints"] == expected
    assert report["checkpoint"] == str(run) and report["step"] == 3
    assert json.loads((_evaluation(out) / "eval_run.json").read_text())["settings"]["model_checkpoints"] == expected

    # a newer complete checkpoint changes what `RUN_DIR` means: resuming must not mix the two
    _async_checkpoints(run, tiny_model, {"policy": [4]})
    with pytest.raises(ValueError, match=r"eval\.resume: .*model_checkpoints\.policy"):
        prepare(_two_model_config(out, "eval.max_questions=2", "eval.resume=true"), run)
    ev = prepare(_two_model_config(out, "eval.max_questions=2", "eval.resume=true"), run, version=3)
    assert len(ev.done) == 2 and ev.model_dirs["policy"] == policy_ckpt / "policy"  # --version pins step_3


def test_version_picks_that_checkpoint_and_names_what_exists_when_missing(tmp_path, tiny_model):
    run = tmp_path / "run"
    _async_checkpoints(run, tiny_model, {"policy": [1, 2, 3], "judge": [2, 3]}, torn={"judge": [1]})
    ev = prepare(_two_model_config(tmp_path / "a"), run, version=2)
    assert ev.model_dirs == {m: run / f"learner-{m}/checkpoints/step_2/{m}" for m in ("policy", "judge")}
    assert ev.step == 2
    _async_checkpoints(run, tiny_model, {"policy": [4]})
    ev = prepare(_two_model_config(tmp_path / "a"), run)  # each learner counts its own versions
    assert {m: c["step"] for m, c in ev.model_checkpoints().items()} == {"policy": 4, "judge": 3}
    assert ev.step == 4  # results are filed under the newest

    with pytest.raises(ValueError) as err:
        prepare(_two_model_config(tmp_path / "b"), run, version=1)  # judge's step_1 is torn
    message = str(err.value)
    assert "--version 1" in message and "'judge'" in message and "step_2, step_3" in message
    with pytest.raises(ValueError, match="pass the run directory"):
        prepare(_two_model_config(tmp_path / "c"), run / "learner-policy/checkpoints/step_1", version=1)
    with pytest.raises(ValueError, match="needs --checkpoint RUN_DIR"):
        prepare(_two_model_config(tmp_path / "d"), None, version=1)


def test_run_directory_without_a_complete_checkpoint_exits_2_and_frozen_models_come_from_config(
        tmp_path, tiny_model, capsys):
    run = tmp_path / "run"
    _async_checkpoints(run, tiny_model, {"policy": [1]}, torn={"judge": [1]})
    code = cli(["eval", "--config", str(SMOKE), "--checkpoint", str(run), *TWO_MODELS,
                f"trainer.output_dir={tmp_path / 'out'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint of trained model 'judge'" in err and str(run / "learner-judge/checkpoints") in err

    from drmas.models.loading import build_tiny_model

    cfg = _two_model_config(tmp_path / "out", "models.judge.trainable=false")
    ev = prepare(cfg, run)
    assert ev.model_dirs == {"policy": run / "learner-policy/checkpoints/step_1/policy",
                             "judge": build_tiny_model(cfg.models["judge"].tiny)}
    assert ev.model_checkpoints()["judge"] is None
