"""A generated multi-hop QA world (task "multihop"): fictional entities, their passages and questions.

The search system needs questions whose answers must be looked up, a corpus to look them up in, and no
download. `drmas.tasks.multihop_world` invents a small world from `task.seed` (this module asks about it):
`task.n_entities` people with made-up names (from a syllable generator), and the cities, countries,
companies and universities they relate to. Every fact is a functional relation (one value per subject): a
person was born in one city, works for one company, has one mentor, at most one spouse and one sibling; a
city lies in one country and has one mayor; a company has one founder and one headquarters city. Because
the model cannot have memorised an invented world, answering requires retrieval.

The world is rendered as a Wikipedia-style passage corpus (title = entity name, 2-4 sentences stating
its facts; people get an "early life" and a "career" passage), ids ``w<N>``. Questions are:

- 1-hop: one relation of a named subject ("In which city was Talomir Veska born?");
- 2-hop: a relation of the entity another relation leads to ("In which country is the city where
  Talomir Veska was born?"), answerable only by reading the subject's passage and then the bridge's.

Each question names a unique subject (all names are distinct), and its answer never appears in the
question (which drops e.g. "Who founded the company X works for?" when X is the founder). A Problem's
meta holds `hops`, `golden_answers` and `support_ids` (the passage stating each hop's fact, in order).

Splits are disjoint by fact, not only by wording: the test split takes its (subject, relations) facts
first from the seeded shuffle, so it depends only on the seed, the world size, `n_test` and the 2-hop
share; training draws from the remaining facts and, only when they run out, reuses remaining facts under
other wordings (never a test fact).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from drmas.config.tasks import MultihopSettings
from drmas.retrieval.base import Passage
from drmas.tasks import TASKS
from drmas.tasks.base import Problem
from drmas.tasks.multihop_world import EXCLUDED_CHAINS, RELATIONS, Entity, World, build_world
from drmas.tasks.qa_files import load_benchmark_file
from drmas.tasks.qa_grading import check_metric, grade_response, normalize_answer

SPLITS = ("train", "test")


@dataclass(frozen=True)
class FactChain:
    """What a question asks, independent of its wording: a subject and one or two relations."""

    subject: str
    relations: tuple[str, ...]
    answer: str
    bridge: Optional[str]  # the entity the first relation leads to (2-hop only)
    support_ids: tuple[str, ...]
    wordings: tuple[str, ...]  # every distinct question text for this chain


def _one_hop_wordings(relation: str, subject: Entity) -> list[str]:
    return [template.format(s=subject.name, **subject.facts) for template in RELATIONS[relation].questions]


def _two_hop_wordings(first: str, second: str, subject: Entity) -> list[str]:
    return [template.format(s=phrase.format(s=subject.name))
            for phrase in RELATIONS[first].phrases for template in RELATIONS[second].questions]


def _answer_in_question(answer: str, question: str) -> bool:
    """Whether the answer is readable off the question (as whole words, after normalisation)."""
    return f" {normalize_answer(answer)} " in f" {normalize_answer(question)} "


def fact_chains(world: World) -> list[FactChain]:
    """Every answerable 1-hop and 2-hop question of the world, in a deterministic order."""
    chains: list[FactChain] = []
    for subject in world.entities.values():
        for first, value in subject.facts.items():
            relation = RELATIONS[first]
            chains.append(FactChain(subject.name, (first,), value, None, (subject.fact_passage[first],),
                                    tuple(_one_hop_wordings(first, subject))))
            if relation.target is None:
                continue
            bridge = world.entities[value]
            for second, answer in bridge.facts.items():
                if (first, second) in EXCLUDED_CHAINS or RELATIONS[second].one_hop_only:
                    continue
                chains.append(FactChain(subject.name, (first, second), answer, bridge.name,
                                        (subject.fact_passage[first], bridge.fact_passage[second]),
                                        tuple(_two_hop_wordings(first, second, subject))))
    return [c for c in chains if not any(_answer_in_question(c.answer, w) for w in c.wordings)]


def _problem(chain: FactChain, question: str, split: str, index: int) -> Problem:
    return Problem(
        uid=f"multihop-{split}-{index:06d}",
        question=question,
        answer=chain.answer,
        meta={
            "hops": len(chain.relations),
            "golden_answers": [chain.answer],
            "support_ids": list(chain.support_ids),
            "relations": list(chain.relations),
            "subject": chain.subject,
            "bridge": chain.bridge,
        },
    )


def _take(rng: random.Random, pool: list[FactChain], wanted: int, split: str, hops: int,
          cfg: MultihopSettings) -> list[tuple[FactChain, str]]:
    """`wanted` (chain, wording) pairs from the front of `pool` (removed from it): one wording per chain
    first, then the chains' other wordings when the training split needs more questions than facts."""
    chosen = pool[:wanted]
    del pool[:wanted]
    taken = [(chain, rng.choice(chain.wordings)) for chain in chosen]
    if len(taken) < wanted and split == "train":
        extra = [(chain, text) for chain, first in taken for text in chain.wordings if text != first]
        rng.shuffle(extra)
        taken += extra[: wanted - len(taken)]
    if len(taken) < wanted:
        raise ValueError(
            f"multihop task: the world of task.n_entities={cfg.n_entities} has too few {hops}-hop questions for "
            f"task.n_{split}={getattr(cfg, 'n_' + split)} at task.two_hop_share={cfg.two_hop_share} "
            f"({len(taken)} of {wanted} available); increase task.n_entities or lower task.n_{split}"
        )
    return taken


def generate_splits(world: World, cfg: MultihopSettings) -> dict[str, list[Problem]]:
    """Train and test problems, disjoint by fact; the test split is drawn first (independent of n_train)."""
    rng = random.Random(f"multihop-questions-{cfg.seed}")
    chains = fact_chains(world)
    pools = {hops: [c for c in chains if len(c.relations) == hops] for hops in (1, 2)}
    for pool in pools.values():
        rng.shuffle(pool)
    splits: dict[str, list[Problem]] = {}
    for split in ("test", "train"):
        size = cfg.n_test if split == "test" else cfg.n_train
        n_two = round(size * cfg.two_hop_share)
        picked = _take(rng, pools[1], size - n_two, split, 1, cfg) + _take(rng, pools[2], n_two, split, 2, cfg)
        rng.shuffle(picked)
        splits[split] = [_problem(chain, text, split, i) for i, (chain, text) in enumerate(picked)]
    return splits


class MultihopTask:
    """The generated multi-hop world: its passages, 1-/2-hop questions, and EM/F1 grading of <answer>."""

    name = "multihop"

    def __init__(self, cfg: MultihopSettings, metric: str = "em") -> None:
        cfg.validate("task")
        self.metric = check_metric(metric)
        self.world = build_world(cfg.seed, cfg.n_entities)
        self._splits = generate_splits(self.world, cfg)

    def split(self, name: str) -> Sequence[Problem]:
        """The problems of split `name` ("train" or "test")."""
        if name not in self._splits:
            raise ValueError(f"multihop task has no split {name!r}; known: {', '.join(SPLITS)}")
        return self._splits[name]

    def passages(self) -> list[Passage]:
        """The world's corpus, the passages a retriever indexes."""
        return list(self.world.passages)

    def grade(self, problem: Problem, response: str) -> float:
        """EM (or F1, per `metric`) of the response's last <answer> against the golds; 0.0 without one."""
        return grade_response(response, problem.meta.get("golden_answers") or [problem.answer], self.metric)

    def load_benchmark(self, path: str | Path) -> list[Problem]:
        """Questions of a Search-R1-layout QA file (for `drmas eval` benchmarks)."""
        return load_benchmark_file(path)


@TASKS.register("multihop", settings=MultihopSettings)
def make_multihop_task(cfg: MultihopSettings, metric: str = "em") -> MultihopTask:
    """Registry factory: the generated multi-hop world of `cfg`, graded by `metric` ('em' or 'f1')."""
    return MultihopTask(cfg, metric)
