"""`drmas new-system NAME`: the skeleton it writes is a plugin that `drmas run` trains out of the box, in the
colocated loop (a plugin outside the package, in this loop: its async twin is tests/test_plugins.py)."""

from __future__ import annotations

import sys

import pytest
from cli_run import run_cli

from drmas import assembly
from drmas.cli import main
from drmas.mas import AgentTurn
from drmas.runtime.metrics import read_metrics
from drmas.scaffold import new_system


@pytest.mark.e2e
@pytest.mark.timeout(600)  # the first run primes the scaffold's tiny model on its own formats (cached after)
def test_a_new_system_trains_out_of_the_box(tmp_path):
    made = run_cli([sys.executable, "-m", "drmas.cli", "new-system", "my_system", "--dir", "systems"], timeout=60,
                   cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "train it: drmas run --config systems/my_system.yaml" in made.stdout
    module = (tmp_path / "systems" / "my_system.py").read_text()
    assert '@ORCHESTRAS.register("my_system", settings=MySystemSettings)' in module and "template" not in module
    # as written: the config's relative plugin path and output directory, run from the directory it was made in
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", "systems/my_system.yaml"], timeout=480,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "runs" / "my_system"
    steps = [r for r in read_metrics(out / "metrics.jsonl") if "loss/policy" in r]  # (step 0: accuracy before)
    assert [r["step"] for r in steps] == [1, 2]
    assert all("reward/writer/mean" in r and "reward/critic/mean" in r for r in steps)
    # the tiny model was primed to the system's own formats (its registered PrimingFormats): the critic writes its
    # <verdict> tag (with math's <verify> formats it wrote none: valid 0, a flat reward, no gradient)
    assert all(r["valid/critic"] > 0.5 and r["valid/writer"] > 0.5 for r in steps), steps
    assert f"- {tmp_path / 'systems' / 'my_system.py'}" in (out / "config.yaml").read_text()
    assert "held-out accuracy: before" in done.stdout


@pytest.mark.parametrize(("name", "message"), [
    ("my-system", "'my-system' is not a Python identifier"),
    ("search", "'search' is the name of a registered system"),
    ("json", "a module named 'json' is importable already"),
])
def test_unusable_names_are_refused(tmp_path, capsys, name, message):
    assert main(["new-system", name, "--dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_existing_files_are_kept_unless_forced(tmp_path, capsys):
    assert main(["new-system", "mine", "--dir", str(tmp_path)]) == 0
    (tmp_path / "mine.py").write_text("# my work\n")
    assert main(["new-system", "mine", "--dir", str(tmp_path)]) == 2
    assert "already there: " in capsys.readouterr().err and (tmp_path / "mine.py").read_text() == "# my work\n"
    assert main(["new-system", "mine", "--dir", str(tmp_path), "--force"]) == 0
    assert "class MineOrchestra" in (tmp_path / "mine.py").read_text()


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory):
    """The generated plugin, imported through its config: its orchestra, task and format penalty."""
    _, config = new_system("scaffold_rewards", tmp_path_factory.mktemp("scaffold"))

    def build(rounds: int):
        cfg = assembly.load_config(config, [f"system.rounds={rounds}"])
        task = assembly.build_task(cfg)
        return assembly.build_orchestra(cfg, task), task, cfg.algorithm.invalid_penalty
    return build


def _rewards(orchestra, problem, penalty: float, replies: dict[str, str]) -> dict[str, float]:
    """Each agent's reward per turn, format penalty included, when every turn of an agent is its scripted reply
    (the lowest over its turns: what a policy that always writes it is paid at worst)."""
    episode, reply, asked = orchestra.run(problem), None, []
    try:
        while True:
            turn = episode.send(reply)
            assert isinstance(turn, AgentTurn)
            asked.append(turn.agent)
            reply = replies[turn.agent]
    except StopIteration as stop:
        outcome = stop.value
    assert [t.agent for t in outcome.turns] == asked
    paid: dict[str, float] = {}
    for i, turn in enumerate(outcome.turns):
        reward = outcome.turn_reward(i) - penalty * (not turn.valid)
        paid[turn.agent] = min(paid.get(turn.agent, reward), reward)
    return paid


@pytest.mark.parametrize("rounds", [1, 2])
def test_the_scaffolds_rewards_pay_no_reply_without_an_answer_above_a_wrong_one(scaffold, rounds):
    """The template teaches its rewards: a critic that writes no verdict (or a writer no answer) must never be
    paid more than one that answers wrongly, or the policy learns to stop answering."""
    orchestra, task, penalty = scaffold(rounds)
    problem = task.split("train")[0]
    right, wrong = f"So \\boxed{{{problem.answer}}}.", f"So \\boxed{{{int(problem.answer) + 1}}}."
    silent = {"writer": "I cannot tell.", "critic": "Looks fine to me."}
    for answer, wrong_verdict in ((right, "<verdict>reject</verdict>"), (wrong, "<verdict>accept</verdict>")):
        wrong_critic = _rewards(orchestra, problem, penalty, {"writer": answer, "critic": wrong_verdict})["critic"]
        no_verdict = _rewards(orchestra, problem, penalty, {"writer": answer, "critic": silent["critic"]})["critic"]
        assert no_verdict < wrong_critic, (answer, no_verdict, wrong_critic)
        assert no_verdict == -penalty  # nothing for the verdict, the format penalty for the reply
    for verdict in ("<verdict>accept</verdict>", "<verdict>reject</verdict>", silent["critic"]):
        wrong_writer = _rewards(orchestra, problem, penalty, {"writer": wrong, "critic": verdict})["writer"]
        no_answer = _rewards(orchestra, problem, penalty, {"writer": silent["writer"], "critic": verdict})["writer"]
        assert no_answer < wrong_writer, (verdict, no_answer, wrong_writer)
