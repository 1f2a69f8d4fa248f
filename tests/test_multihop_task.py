"""The generated multi-hop QA world: determinism, corpus shape, answerability, splits and grading."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from drmas.config.tasks import MultihopSettings
from drmas.retrieval.base import Passage
from drmas.tasks import build_task
from drmas.tasks.base import Problem
from drmas.tasks.multihop import RELATIONS, MultihopTask, fact_chains, make_multihop_task
from drmas.tasks.qa_grading import normalize_answer

FIXTURES = Path(__file__).parent / "fixtures" / "qa"
SMALL = MultihopSettings(seed=7, n_entities=40, n_train=300, n_test=60, two_hop_share=0.5)


@pytest.fixture(scope="module")
def task() -> MultihopTask:
    built = build_task(SMALL)
    assert isinstance(built, MultihopTask)
    return built


def _fact(problem: Problem) -> tuple:
    return problem.meta["subject"], tuple(problem.meta["relations"])


def _snapshot(task: MultihopTask) -> tuple:
    problems = [(p.uid, p.question, p.answer, p.meta) for name in ("train", "test") for p in task.split(name)]
    return task.passages(), problems


# --- determinism -----------------------------------------------------------------------------------


def test_same_seed_gives_the_identical_world_and_questions(task: MultihopTask) -> None:
    assert _snapshot(MultihopTask(SMALL)) == _snapshot(task)


def test_another_seed_gives_another_world(task: MultihopTask) -> None:
    other = MultihopTask(replace(SMALL, seed=8))
    assert set(other.world.entities) != set(task.world.entities)
    assert [p.contents for p in other.passages()] != [p.contents for p in task.passages()]
    assert [p.question for p in other.split("test")] != [p.question for p in task.split("test")]


def test_test_split_does_not_depend_on_the_training_size(task: MultihopTask) -> None:
    bigger = MultihopTask(replace(SMALL, n_train=500))
    def pairs(t: MultihopTask) -> list[tuple[str, str]]:
        return [(p.question, p.answer) for p in t.split("test")]

    assert pairs(bigger) == pairs(task)


# --- the corpus ------------------------------------------------------------------------------------


def test_corpus_is_wikipedia_style_with_w_ids(task: MultihopTask) -> None:
    passages = task.passages()
    assert all(isinstance(p, Passage) for p in passages)
    assert [p.id for p in passages] == [f"w{i}" for i in range(len(passages))]
    names = set(task.world.entities)
    for passage in passages:
        assert passage.title in names
        sentences = re.split(r"(?<=\.)\s+", passage.text.strip())
        assert 2 <= len(sentences) <= 4, passage.contents
        assert passage.title in passage.text  # the entity is named in its own text, not only the title
    # people have an early-life and a career passage; every other entity one passage
    n_people = sum(e.kind == "person" for e in task.world.entities.values())
    assert n_people == SMALL.n_entities
    assert len(passages) == len(names) + n_people


def test_entity_names_are_unique_across_kinds(task: MultihopTask) -> None:
    normalised = [normalize_answer(name) for name in task.world.entities]
    assert len(set(normalised)) == len(normalised)
    kinds = {e.kind for e in task.world.entities.values()}
    assert kinds == {"person", "city", "country", "company", "university"}
    for entity in task.world.entities.values():
        for relation, value in entity.facts.items():
            assert entity.kind in RELATIONS[relation].domain
            target = RELATIONS[relation].target
            if target is not None:  # relations to entities point at an existing entity of the right kind
                assert task.world.entities[value].kind == target


# --- questions -------------------------------------------------------------------------------------


def test_splits_have_the_configured_sizes_and_two_hop_share(task: MultihopTask) -> None:
    for name, size in (("train", SMALL.n_train), ("test", SMALL.n_test)):
        problems = task.split(name)
        assert len(problems) == size
        assert sum(p.meta["hops"] == 2 for p in problems) == round(size * SMALL.two_hop_share)
        assert {p.meta["hops"] for p in problems} == {1, 2}
        assert len({p.uid for p in problems}) == size


@pytest.mark.parametrize("share", [0.0, 0.25, 1.0])
def test_two_hop_share_is_followed(share: float) -> None:
    task = MultihopTask(replace(SMALL, n_train=40, n_test=20, two_hop_share=share))
    assert sum(p.meta["hops"] == 2 for p in task.split("train")) == round(40 * share)
    assert sum(p.meta["hops"] == 2 for p in task.split("test")) == round(20 * share)


def test_train_and_test_are_disjoint_by_text_and_by_fact(task: MultihopTask) -> None:
    train, test = task.split("train"), task.split("test")
    assert {p.question for p in train}.isdisjoint({p.question for p in test})
    assert {_fact(p) for p in train}.isdisjoint({_fact(p) for p in test})
    assert len({p.question for p in train}) == len(train)


def test_every_question_is_answerable_from_its_support_passages(task: MultihopTask) -> None:
    by_id = {p.id: p for p in task.passages()}
    for problem in [*task.split("train"), *task.split("test")]:
        meta = problem.meta
        support = [by_id[i] for i in meta["support_ids"]]
        assert len(support) == meta["hops"] == len(meta["relations"])
        assert meta["golden_answers"] == [problem.answer]
        assert meta["subject"] in problem.question
        assert support[0].title == meta["subject"]
        assert meta["subject"] in support[0].contents
        assert problem.answer in support[-1].text, (problem.question, support[-1].contents)
        if meta["hops"] == 2:
            # the first passage leads to the bridge, whose own passage states the answer
            assert meta["bridge"] in support[0].text
            assert support[1].title == meta["bridge"]
            assert meta["bridge"] not in problem.question
        # the answer cannot be read off the question
        assert f" {normalize_answer(problem.answer)} " not in f" {normalize_answer(problem.question)} "


def test_question_subjects_and_answers_are_unambiguous(task: MultihopTask) -> None:
    # Every (subject, relation chain) has exactly one answer: no chain appears twice with different answers.
    answers: dict[tuple, set[str]] = {}
    for chain in fact_chains(task.world):
        answers.setdefault((chain.subject, chain.relations), set()).add(chain.answer)
    assert all(len(found) == 1 for found in answers.values())
    # a question names its subject and no other entity, except the employer in "when did X join <company>?"
    names = list(task.world.entities)
    for problem in [*task.split("train"), *task.split("test")]:
        subject = problem.meta["subject"]
        named = {n for n in names if re.search(rf"\b{re.escape(n)}\b", problem.question)}
        facts = task.world.entities[subject].facts
        allowed = {facts["works_for"]} if problem.meta["relations"] == ["joined_year"] else set()
        assert subject in named and named - {subject} <= allowed, problem.question


def test_example_questions_read_naturally(task: MultihopTask) -> None:
    questions = [text for chain in fact_chains(task.world) for text in chain.wordings]
    assert any(re.fullmatch(r"In which city was [A-Z]\w+ [A-Z]\w+ born\?", q) for q in questions)
    assert any(re.fullmatch(r"In which country is the city where [A-Z]\w+ [A-Z]\w+ was born\?", q) for q in questions)
    assert all(q.endswith("?") and "{" not in q and "  " not in q for q in questions)
    assert all(p.question in questions for p in task.split("train"))


def test_training_reuses_other_wordings_when_facts_run_out() -> None:
    cfg = replace(SMALL, n_entities=8, n_test=5, two_hop_share=0.0)
    n_one_hop = sum(len(c.relations) == 1 for c in fact_chains(MultihopTask(replace(cfg, n_train=1)).world))
    task = MultihopTask(replace(cfg, n_train=n_one_hop - 5 + 10))
    train, test = task.split("train"), task.split("test")
    assert len({p.question for p in train}) == len(train)  # still distinct texts
    assert len({_fact(p) for p in train}) == n_one_hop - 5  # every remaining fact, some twice
    assert {_fact(p) for p in train}.isdisjoint({_fact(p) for p in test})


# --- grading ---------------------------------------------------------------------------------------


def test_grade_is_exact_match_of_the_answer_tag_by_default(task: MultihopTask) -> None:
    person_question = next(p for p in task.split("test") if p.meta["relations"][-1] in ("mentor", "spouse", "founder"))
    gold = person_question.answer
    assert task.metric == "em"
    assert task.grade(person_question, f"<think>search</think><answer> {gold.upper()}. </answer>") == 1.0
    assert task.grade(person_question, f"<answer>{gold.split()[0]}</answer>") == 0.0
    assert task.grade(person_question, gold) == 0.0  # no <answer> tag


def test_f1_metric_gives_partial_credit() -> None:
    task = make_multihop_task(SMALL, metric="f1")
    problem = next(p for p in task.split("test") if len(p.answer.split()) == 2)
    assert task.grade(problem, f"<answer>{problem.answer.split()[0]}</answer>") == pytest.approx(2 / 3)


def test_load_benchmark_reads_search_r1_files(task: MultihopTask) -> None:
    problems = task.load_benchmark(FIXTURES / "bamboogle.jsonl")
    assert [p.answer for p in problems] == ["Jomo Kenyatta", "1775"]
    assert task.grade(problems[0], "<answer>jomo kenyatta</answer>") == 1.0


# --- configuration errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_entities": 3}, "task.n_entities: must be >= 8"),
        ({"two_hop_share": 1.5}, r"task.two_hop_share: must be in \[0, 1\]"),
        ({"n_test": -1}, "task.n_test: must be >= 0"),
        ({"n_entities": 8, "n_train": 5000}, "too few 1-hop questions for task.n_train=5000"),
    ],
)
def test_bad_config_is_rejected_naming_the_key(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultihopTask(replace(SMALL, **change))


def test_unknown_metric_and_split_are_rejected(task: MultihopTask) -> None:
    with pytest.raises(ValueError, match="system.reward_metric"):
        MultihopTask(SMALL, metric="bleu")
    with pytest.raises(ValueError, match="no split 'dev'"):
        task.split("dev")
