"""A generated arithmetic word-problem task, so training and tests need no downloaded data set.

Each problem is a short story about one person's collection of items: it starts with a number and each
further sentence adds, removes or multiplies. Answers are the story's final count, evaluated step by
step in reading order (not with operator precedence): "has 3, buys 2 more, then ends up with 4 times as
many" is (3 + 2) * 4 = 20. A removal never takes away more than the person holds, so every intermediate
count and every answer is a non-negative integer.

The held-out split is disjoint from training in its arithmetic, not only its wording: the test split
takes the first `n_test` distinct skeletons (operands + operations) drawn from `random.Random(seed)`,
and training problems are drawn from the remaining skeletons, deduplicated by question text. Small
spaces such as the default (two numbers up to 20, "+-": about 600 skeletons) therefore still yield
thousands of distinct training questions, by wording the same arithmetic differently, while a test
question's arithmetic never appears in training. The test split is generated first, so it depends only
on the seed and `n_test`: runs with different `n_train` evaluate on the same problems.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from drmas.config.tasks import OPERATIONS as SUPPORTED_OPERATIONS
from drmas.config.tasks import ArithmeticSettings
from drmas.tasks import TASKS
from drmas.tasks.base import Problem
from drmas.tasks.grading import grade_answer

SPLITS = ("train", "test")
# Draws allowed per wanted problem before the space is declared too small. Uniform draws collect a space
# of N items in about N * ln(N) draws; 50 per problem leaves a wide margin for every practical size.
DRAWS_PER_PROBLEM = 50
MIN_DRAWS = 1000


@dataclass(frozen=True)
class Person:
    name: str
    subject: str  # she / he / they
    object: str  # her / him / them
    possessive: str  # her / his / their
    verb_s: str  # "s" for third-person-singular verbs ("buys"); "" for singular they ("buy")


PEOPLE = (
    Person("Mia", "she", "her", "her", "s"),
    Person("Liam", "he", "him", "his", "s"),
    Person("Ava", "she", "her", "her", "s"),
    Person("Noah", "he", "him", "his", "s"),
    Person("Zoe", "she", "her", "her", "s"),
    Person("Omar", "he", "him", "his", "s"),
    Person("Ben", "he", "him", "his", "s"),
    Person("Priya", "she", "her", "her", "s"),
)
# Countable items as (singular, plural), so "1 apple" and "7 apples" both read naturally.
ITEMS = tuple(
    (noun, noun + "s")
    for noun in ("apple", "marble", "sticker", "book", "coin", "pencil", "shell", "stamp", "card", "cookie")
)

# Sentences for one step of the story, per operation. `{b}` is the step's number and `{b_noun}` the item
# in agreement with it; `{item}` is the plural. Each wording names its operation unambiguously, so the
# question text determines the arithmetic.
OPENINGS = ("{Name} has {a} {a_noun}.", "{Name} starts the day with {a} {a_noun}.")
STEPS = {
    "+": (
        "{Sub} buy{s} {b} more.",
        "A friend gives {obj} {b} more {b_noun}.",
        "{Sub} find{s} {b} more {b_noun}.",
    ),
    "-": (
        "{Sub} give{s} {b} of them to a friend.",
        "{Sub} lose{s} {b} {b_noun}.",
        "{Sub} sell{s} {b} {b_noun}.",
    ),
    "*": (
        "Then {sub} end{s} up with {b} times as many {item} as before.",
        "Then {pos} number of {item} grows to {b} times what it was.",
    ),
}
QUESTION = "How many {item} {does} {sub} have now?"
# Compact one-sentence forms for two-number problems, keyed by operation.
SHORT_FORMS = {
    "+": "{Name} has {a} {a_noun} and buy{s} {b} more. How many {item} {does} {sub} have now?",
    "-": "{Name} has {a} {a_noun} and give{s} {b} of them away. How many {item} {does} {sub} have left?",
    "*": "{Name} buy{s} {a} bag{a_s} with {b} {b_noun} in each bag. How many {item} {does} {sub} buy in total?",
}


@dataclass(frozen=True)
class Skeleton:
    """The arithmetic of one problem: what makes two problems the same, whatever their wording."""

    operands: tuple[int, ...]
    ops: tuple[str, ...]


def evaluate(operands: Sequence[int], ops: Sequence[str]) -> int:
    """The story's final count: the operations applied left to right, in reading order."""
    total = operands[0]
    for op, value in zip(ops, operands[1:]):
        total = apply_op(total, op, value)
    return total


def apply_op(total: int, op: str, value: int) -> int:
    """One story step."""
    if op == "+":
        return total + value
    if op == "-":
        return total - value
    if op == "*":
        return total * value
    raise ValueError(f"unknown operation {op!r}; supported: {SUPPORTED_OPERATIONS!r}")


def space_upper_bound(cfg: ArithmeticSettings) -> int:
    """Number of skeletons ignoring the no-negative rule: an exact cap used to fail fast when it is too small."""
    n_ops = len(set(cfg.operations))
    return sum(n_ops ** (n - 1) * cfg.max_value**n for n in range(cfg.min_operands, cfg.max_operands + 1))


def draw_skeleton(rng: random.Random, cfg: ArithmeticSettings) -> Skeleton | None:
    """One random skeleton, or None when a removal would exceed the count held (the draw is discarded).

    The operand count is uniform over [min_operands, max_operands] so short and long problems are equally
    common; a removal draws from 1..min(max_value, current count) to keep counts non-negative.
    """
    ops_alphabet = sorted(set(cfg.operations))
    n = rng.randint(cfg.min_operands, cfg.max_operands)
    total = rng.randint(1, cfg.max_value)
    operands, ops = [total], []
    for _ in range(n - 1):
        op = rng.choice(ops_alphabet)
        limit = min(cfg.max_value, total) if op == "-" else cfg.max_value
        if limit < 1:
            return None
        value = rng.randint(1, limit)
        operands.append(value)
        ops.append(op)
        total = apply_op(total, op, value)
    return Skeleton(tuple(operands), tuple(ops))


def draw_test_skeletons(rng: random.Random, cfg: ArithmeticSettings) -> list[Skeleton]:
    """`cfg.n_test` distinct skeletons in draw order; ValueError naming the knobs when too few exist."""
    wanted = cfg.n_test
    if space_upper_bound(cfg) < wanted:
        raise ValueError(_too_small_message(cfg, "test", space_upper_bound(cfg)))
    seen: set[Skeleton] = set()
    pool: list[Skeleton] = []
    draws = 0
    while len(pool) < wanted:
        draws += 1
        if draws > _draw_budget(wanted):
            raise ValueError(_too_small_message(cfg, "test", len(pool)))
        skeleton = draw_skeleton(rng, cfg)
        if skeleton is not None and skeleton not in seen:
            seen.add(skeleton)
            pool.append(skeleton)
    return pool


def draw_train_problems(rng: random.Random, cfg: ArithmeticSettings, held_out: set[Skeleton]) -> list[Problem]:
    """`cfg.n_train` problems with distinct texts whose skeletons are not `held_out`.

    A skeleton may come back under different wording (names, items, sentences); the text check keeps
    every training question distinct. ValueError naming the knobs when the space runs dry.
    """
    wanted = cfg.n_train
    texts: set[str] = set()
    problems: list[Problem] = []
    draws = 0
    while len(problems) < wanted:
        draws += 1
        if draws > _draw_budget(wanted):
            raise ValueError(_too_small_message(cfg, "train", len(problems)))
        skeleton = draw_skeleton(rng, cfg)
        if skeleton is None or skeleton in held_out:
            continue
        problem = make_problem(rng, skeleton, "train", len(problems))
        if problem.question not in texts:
            texts.add(problem.question)
            problems.append(problem)
    return problems


def _draw_budget(wanted: int) -> int:
    """Draws allowed to collect `wanted` distinct items before the space is declared too small."""
    return max(MIN_DRAWS, DRAWS_PER_PROBLEM * wanted)


def _too_small_message(cfg: ArithmeticSettings, split: str, found: int) -> str:
    """Error text for a problem space that cannot supply the distinct problems a split asks for."""
    wanted = cfg.n_test if split == "test" else cfg.n_train
    kind = "distinct arithmetic problems" if split == "test" else "distinct questions outside the test split"
    return (
        f"arithmetic task: the problem space is too small for task.n_{split} = {wanted} {kind} "
        f"(found {found} with task.max_value={cfg.max_value}, operands {cfg.min_operands}..{cfg.max_operands}, "
        f"task.operations={cfg.operations!r}, task.n_test={cfg.n_test}); increase task.max_value or "
        f"task.max_operands, add operations to task.operations, or lower task.n_{split}"
    )


def _fields(person: Person, item: tuple[str, str], a: int, b: int) -> dict[str, str | int]:
    """Template fields: the person (with verb agreement), the item, and the numbers with their nouns."""
    singular, plural = item
    return {
        "a": a,
        "b": b,
        "a_noun": singular if a == 1 else plural,
        "b_noun": singular if b == 1 else plural,
        "a_s": "" if a == 1 else "s",
        "Name": person.name,
        "Sub": person.subject.capitalize(),
        "sub": person.subject,
        "obj": person.object,
        "pos": person.possessive,
        "s": person.verb_s,
        "does": "does" if person.verb_s else "do",
        "item": plural,
    }


def render_question(rng: random.Random, skeleton: Skeleton) -> tuple[str, str]:
    """The question text of a skeleton and the id of the template used (kept in meta for analysis)."""
    person, item = rng.choice(PEOPLE), rng.choice(ITEMS)
    operands = skeleton.operands
    if len(skeleton.ops) == 1 and rng.random() < 0.5:
        op = skeleton.ops[0]
        return SHORT_FORMS[op].format(**_fields(person, item, operands[0], operands[1])), f"short{op}"
    sentences = [rng.choice(OPENINGS).format(**_fields(person, item, operands[0], operands[0]))]
    for op, value in zip(skeleton.ops, operands[1:]):
        sentences.append(rng.choice(STEPS[op]).format(**_fields(person, item, operands[0], value)))
    sentences.append(QUESTION.format(**_fields(person, item, operands[0], operands[0])))
    return " ".join(sentences), "story"


def make_problem(rng: random.Random, skeleton: Skeleton, split: str, index: int) -> Problem:
    """A Problem for one skeleton; meta keeps the arithmetic so the answer can be recomputed and audited."""
    question, template = render_question(rng, skeleton)
    return Problem(
        uid=f"arith-{split}-{index:06d}",
        question=question,
        answer=str(evaluate(skeleton.operands, skeleton.ops)),
        meta={"operands": list(skeleton.operands), "ops": list(skeleton.ops), "template": template},
    )


def generate_splits(cfg: ArithmeticSettings) -> dict[str, list[Problem]]:
    """Both splits, deterministic in cfg.seed; test first so it does not depend on n_train."""
    cfg.validate("task")
    rng = random.Random(cfg.seed)
    test_skeletons = draw_test_skeletons(rng, cfg)
    test = [make_problem(rng, skeleton, "test", i) for i, skeleton in enumerate(test_skeletons)]
    train = draw_train_problems(rng, cfg, set(test_skeletons))
    return {"train": train, "test": test}


class ArithmeticTask:
    """Generated arithmetic word problems, graded by the final answer (task.answer_extraction)."""

    name = "arithmetic"

    def __init__(self, cfg: ArithmeticSettings) -> None:
        self._extraction = cfg.answer_extraction
        self._splits = generate_splits(cfg)

    def split(self, name: str) -> Sequence[Problem]:
        """The problems of split `name` ("train" or "test")."""
        if name not in self._splits:
            raise ValueError(f"arithmetic task has no split {name!r}; known: {', '.join(SPLITS)}")
        return self._splits[name]

    def load_benchmark(self, path: str) -> list[Problem]:
        """Problems of a math benchmark file (GSM8K / MATH / AIME jsonl or parquet) for `drmas eval`,
        graded like the generated problems."""
        from drmas.tasks.files import load_benchmark_file

        return load_benchmark_file(path)

    def grade(self, problem: Problem, response: str) -> float:
        """1.0 when the response's final answer (last box; see grade_answer) equals the problem's answer."""
        return grade_answer(response, problem.answer, self._extraction)


@TASKS.register("arithmetic", settings=ArithmeticSettings)
def make_arithmetic_task(cfg: ArithmeticSettings) -> ArithmeticTask:
    """Registry factory: the arithmetic task described by `cfg`."""
    return ArithmeticTask(cfg)
