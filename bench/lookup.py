"""The learning benchmark's CPU setting: a task a tiny model can learn by RL in minutes, and its partial priming.

Task `lookup` (a plugin, written against `drmas.api` only): "Mia has 7 apples, Ben has 12 apples and Ava has
3 apples. How many apples does Ben have?" The answer is one of the question's numbers, so a small transformer
can learn it by attending to the right one: a skill that RL can find in a few hundred steps on 2 cores, where
arithmetic needs a model too large to train there in 30 minutes (SmolLM2-135M: docs/learning.md).
The held-out problems are disjoint from training in their content (people, numbers and who is asked).

`prime_partial` makes the starting model: a tiny random Qwen2 trained on the math system's real solver and
verifier prompts for lookup questions drawn from its own generator (never the task's splits), where the solver's
answer is a number of the question drawn uniformly (the right one as often as each wrong one) and the verifier's
verdict a coin flip. It so learns the formats and "answer with a number of the question", nothing about which
number: greedy, it is right on about 1 / `people` of the problems, and what it gains beyond that in a run comes
from the run's RL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from drmas.api import TASKS, AGENT_ROLES, Problem, TaskSettings, TeamContext, grade_answer, help_field

NAMES = ("Mia", "Liam", "Ava", "Noah", "Zoe", "Omar", "Ben", "Priya", "Lena", "Tom", "Ines", "Raj")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "stamps")


@dataclass
class LookupSettings(TaskSettings):
    """Recall one person's count from a list of counts."""

    name: str = TaskSettings.name_field("lookup")
    seed: int = help_field(0, "Seed of the generated task (same seed -> same problems).")
    n_train: int = help_field(2000, "Training problems.")
    n_test: int = help_field(200, "Held-out problems (disjoint from training in people, numbers and the one asked).")
    people: int = help_field(3, "People (and counts) per question; a model answering one of them at random is "
                             "right on 1 / people.")
    max_value: int = help_field(30, "Counts are distinct numbers in 1..max_value.")

    def problems(self, where: str) -> list[str]:
        found = self.at_least(where, n_train=1, n_test=1, people=2)
        if not self.people <= min(len(NAMES), self.max_value):
            found.append(f"{where}.people: at most {min(len(NAMES), self.max_value)} (the names and the values "
                         f"1..max_value must be distinct), got {self.people}")
        return found


def draw_question(rng: random.Random, people: int, max_value: int) -> tuple[str, str, tuple]:
    """(question, answer, skeleton): the skeleton (names, counts, who is asked) is what makes two problems the same."""
    names = tuple(rng.sample(NAMES, people))
    values = tuple(rng.sample(range(1, max_value + 1), people))
    asked = rng.randrange(people)
    item = rng.choice(ITEMS)
    parts = [f"{n} has {v} {item}" for n, v in zip(names, values)]
    listing = ", ".join(parts[:-1]) + f" and {parts[-1]}"
    return f"{listing}. How many {item} does {names[asked]} have?", str(values[asked]), (names, values, asked)


class LookupTask:
    name = "lookup"

    def __init__(self, cfg: LookupSettings) -> None:
        rng = random.Random(cfg.seed)
        seen: set[tuple] = set()
        self._splits: dict[str, list[Problem]] = {}
        for split, size in (("test", cfg.n_test), ("train", cfg.n_train)):
            problems = []
            while len(problems) < size:
                question, answer, skeleton = draw_question(rng, cfg.people, cfg.max_value)
                if skeleton not in seen:
                    seen.add(skeleton)
                    problems.append(Problem(f"lookup-{split}-{len(problems):05d}", question, answer))
            self._splits[split] = problems

    def split(self, name: str) -> list[Problem]:
        return self._splits[name]

    def grade(self, problem: Problem, response: str) -> float:
        return grade_answer(response, problem.answer)


@TASKS.register("lookup", settings=LookupSettings)
def make_lookup_task(cfg: LookupSettings) -> LookupTask:
    return LookupTask(cfg)


def _primer_draw(tokenizer, people: int, max_value: int):
    """A draw of priming examples on the math system's prompts: the solver (first round or a revision) boxes a
    uniformly drawn number of the question; the verifier gives a coin-flip verdict on a drawn number."""
    from drmas.core.tool_calls import prompt_ids

    solver, verifier = AGENT_ROLES.get("solver")(), AGENT_ROLES.get("verifier")()

    def example(rng: random.Random) -> tuple[list[int], int]:
        question, _, (_, values, _) = draw_question(rng, people, max_value)
        problem, context = Problem("prime", question, ""), TeamContext()
        guess = rng.choice(values)
        if rng.random() < 0.5:
            agent, reply = verifier, rng.choice(("<verify>approve</verify>", "<verify>reject</verify>"))
            context.add("solver", f"The answer is \\boxed{{{guess}}}.")
        else:
            agent, reply = solver, f"The answer is \\boxed{{{guess}}}."
            if rng.random() < 0.3:  # a revision round after a rejection
                context.add("solver", f"The answer is \\boxed{{{rng.choice(values)}}}.")
                context.add("verifier", "<verify>reject</verify>")
        ids = prompt_ids(tokenizer, agent.messages(problem, context), None)
        reply_ids = tokenizer(reply + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
        return ids + reply_ids, len(ids)

    return lambda rng, n: [example(rng) for _ in range(n)]


def prime_partial(base: Path, out: Path, steps: int, seed: int, people: int, max_value: int) -> Path:
    """`base` (a tiny model's directory) primed as the module docstring says, saved to `out` (kept: built once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas.models.priming import prime_on

    if (out / "config.json").exists():
        return out
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    loss = prime_on(model, tokenizer, steps, seed, _primer_draw(tokenizer, people, max_value), batch_size=16)
    print(f"primed {base.name} for {steps} steps on lookup formats: last loss {loss:.3f}", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out
