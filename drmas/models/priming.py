"""Format priming of tiny random test models.

A randomly initialised model emits uniform noise over a 49k vocabulary: every episode then fails the same
way, all rewards in a group are equal, every advantage is 0 and no gradient flows, so tests and smoke runs
would exercise nothing. Priming trains the tiny model for a few dozen steps on the agents' *output
formats* with random numbers (`The answer is \\boxed{7}.`, `<verify>reject</verify>`), never on the
answers to problems. The primed model writes well-formed outputs with arbitrary numbers, so rewards
vary within a group and the whole training path runs for real. The `code` formats (a function in a code block,
asserts) use made-up function names, none of a task's: a coder is valid only when it names the task's function.
The `tools` formats (a tool call, a boxed answer) come after prompts that offer an `add` tool as drmas renders it
(`drmas.core.tool_calls`): the primed model calls its tool at random, enough for a tool round trip to run for
real, not to use the tool well.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Sequence, Union

import torch

from drmas.core.registry import Registry
from drmas.core.tool_calls import prompt_ids as chat_prompt_ids

_SOLVER_FORMATS = ("The answer is \\boxed{{{n}}}.", "{a} + {b} = {n}, so \\boxed{{{n}}}.")
_VERIFIER_FORMATS = ("<verify>approve</verify>", "<verify>reject</verify>")
_SEARCH_FORMATS = ("<verify>yes</verify>", "<verify>no</verify>", "<search>{w} {v}</search>", "<answer>{w}</answer>",
                   "<answer>{w} {v}</answer>")
# a code block defining a function, and asserts calling one (examples/code_review's coder and tester)
_CODE_FORMATS = ("```python\ndef {f}(x):\n    return x + {n}\n```", "```python\ndef {f}(a, b):\n    return a * b\n```",
                 "```python\nassert {f}({a}) == {n}\n```", "```python\nassert {f}({a}, {b}) == {n}\n```")
# a Hermes tool call of an `add` function, and a boxed answer (examples/openai_agents/tools_agent.py)
_TOOL_FORMATS = ('<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>',
                 "The answer is \\boxed{{{n}}}.")
_FUNCTIONS = ("f", "total", "double", "count", "value", "combine", "check", "size")
_WORDS = ("city", "born", "river", "company", "founded", "mentor", "year", "Veska", "Talomir", "Orvane", "Kesh",
          "Ludra", "Mirel", "piano", "engineer", "capital", "Dovrin", "Sela")
_PEAK_LR = 5e-3
PRIMING_RECIPE = 2  # bumped whenever the recipe changes, so cached primed models are rebuilt
_ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


@dataclass(frozen=True)
class PrimingFormats:
    """What a tiny random model is primed to write (`models.<id>.tiny.prime_system` names a registered set).

    `replies` are reply templates, each primed after a chat prompt of random filler words; `exchanges` are
    (prompt, reply template) pairs, the reply primed after that prompt: a user message, or the chat messages an
    agent is sent (a role's own `messages(problem, context)`), so the model learns which format follows which
    role's prompt. Reply templates take random values for `{n}` (0..12), `{a}` and `{b}` (0..9), `{w}` and `{v}`
    (words) and `{f}` (a function name); write `{{` for a literal brace. Prompts are used as given. `tools`: OpenAI
    function definitions offered in every prompt (the chat template renders them). Priming teaches formats with
    random values, never a task's answers: rewards then vary within a group and gradients flow."""

    replies: tuple[str, ...] = ()
    exchanges: tuple[tuple[Union[str, Sequence[dict]], str], ...] = ()
    tools: tuple[dict, ...] = ()

    def problems(self, where: str) -> list[str]:
        """What makes the set unusable, each message naming `where`."""
        if not self.replies and not self.exchanges:
            return [f"{where}: no replies and no exchanges to prime on"]
        found = []
        for template in (*self.replies, *(reply for _, reply in self.exchanges)):
            try:
                _fill(template, random.Random(0))
            except (KeyError, IndexError, ValueError) as exc:
                found.append(f"{where}: template {template!r} cannot be filled ({type(exc).__name__}: {exc}); its "
                             "fields are {n} {a} {b} {w} {v} {f}, and {{ }} are literal braces")
        return found

    def digest(self) -> str:
        """A short hash of the set's content: the tiny-model cache key, so an edited set primes a new model."""
        payload = json.dumps([self.replies, self.exchanges, self.tools], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


PRIMING_FORMATS: Registry[PrimingFormats] = Registry("priming format set")
BUILT_IN = ("math", "search", "code", "tools")
PRIMING_FORMATS.register("math")(PrimingFormats(replies=_SOLVER_FORMATS + _VERIFIER_FORMATS))
PRIMING_FORMATS.register("search")(PrimingFormats(replies=_SEARCH_FORMATS))
PRIMING_FORMATS.register("code")(PrimingFormats(replies=_CODE_FORMATS))
PRIMING_FORMATS.register("tools")(PrimingFormats(replies=_TOOL_FORMATS, tools=(_ADD_TOOL,)))


def _fill(template: str, rng: random.Random, max_number: int = 12) -> str:
    return template.format(n=rng.randint(0, max_number), a=rng.randint(0, 9), b=rng.randint(0, 9),
                           w=rng.choice(_WORDS), v=rng.choice(_WORDS), f=rng.choice(_FUNCTIONS))


def format_examples(rng: random.Random, size: int, max_number: int = 12, system: str = "math") -> list[tuple]:
    """`size` (prompt, reply) pairs in the formats of the registered set `system`, replies with random numbers and
    words; the prompt is None (random filler), a user message or chat messages."""
    formats = PRIMING_FORMATS.lookup(system, "models.<id>.tiny.prime_system")
    entries = [(None, r) for r in formats.replies] + list(formats.exchanges)
    out = []
    for _ in range(size):
        prompt, reply = rng.choice(entries)
        out.append((prompt, _fill(reply, rng, max_number)))
    return out


def format_corpus(rng: random.Random, size: int, max_number: int = 12, system: str = "math") -> list[str]:
    """`size` short responses in the formats of `system`'s agents, with random numbers and words."""
    return [reply for _, reply in format_examples(rng, size, max_number, system)]


def _filler(rng: random.Random) -> str:
    """A chat prompt of varied length, so the primed formats hold after prompts as long as the agents' own."""
    words = ("how", "many", "apples", "does", "she", "have", "now", "answer", "check", "the", "solver", "said",
             "reply", "with", "verdict", "question", "more", "buys", "gives", "left")
    return " ".join(rng.choice(words) for _ in range(rng.randint(8, 48)))


def _example(tokenizer, rng: random.Random, prompt, response: str,
             tools: tuple[dict, ...] = ()) -> tuple[list[int], int]:
    """Token ids of chat prompt + response + end of turn, and where the response starts: the prompt is `prompt`'s
    chat messages (a string: one user message; None: random filler), the functions `tools` offered as drmas
    renders them."""
    if prompt is None or isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt if prompt is not None else _filler(rng)}]
    prompt_ids = chat_prompt_ids(tokenizer, list(prompt), list(tools) or None)
    response_ids = tokenizer(response + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
    return prompt_ids + response_ids, len(prompt_ids)


def _response_loss(model, input_ids, mask, labels) -> torch.Tensor:
    """Next-token cross-entropy on response tokens only; the vocabulary projection is applied to those
    positions alone (the prompt positions would cost ~10x more in a 49k-token softmax and teach nothing)."""
    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def prime_formats(model: torch.nn.Module, tokenizer, steps: int, seed: int, batch_size: int = 8,
                  system: str = "math") -> float:
    """Train `model` in place, on the device it is on, for `steps` steps on format responses after chat
    prompts (loss on the response tokens only); returns the last loss."""
    device = next(model.parameters()).device
    tools = PRIMING_FORMATS.lookup(system, "models.<id>.tiny.prime_system").tools
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=_PEAK_LR)
    # Warm up, then decay to zero: a constant high rate lets a tiny model collapse onto one format prefix
    # (e.g. "<verify>" + end of turn for every prompt) late in the run, which leaves every reward equal.
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(i / steps, 1.0)))
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    last = float("nan")
    for _ in range(steps):
        examples = [_example(tokenizer, rng, prompt, reply, tools)
                    for prompt, reply in format_examples(rng, batch_size, system=system)]
        width = max(len(ids) for ids, _ in examples)
        input_ids = torch.full((len(examples), width), pad, dtype=torch.long)
        labels = torch.full_like(input_ids, -100)
        mask = torch.zeros_like(input_ids)
        for row, (ids, start) in enumerate(examples):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, start : len(ids)] = torch.tensor(ids[start:])
            mask[row, : len(ids)] = 1
        loss = _response_loss(model, input_ids.to(device), mask.to(device), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        last = loss.detach()
    model.eval()
    return float(last)
