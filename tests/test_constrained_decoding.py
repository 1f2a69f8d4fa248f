"""Constrained decoding in the embedded engine (xgrammar), on the tiny random model: a reply under a JSON schema or a
forced tool call is always what the grammar allows, its behaviour log-probs are those of the constrained
distribution (recomputed apart, tests/constrained_replay.py), rows without a constraint in the same batch sample
exactly as alone, and a constraint that does not compile is refused naming why."""

from __future__ import annotations

import json

import pytest

from constrained_replay import VERDICT, constrained_logprobs
from drmas.core.constraints import Constraint
from drmas.core.tool_calls import hermes_calls, parse_hermes
from drmas.engines.base import SamplingParams
from drmas.engines.embedded import EmbeddedEngine

SWITCH = {"type": "function", "function": {"name": "switch", "description": "Turn a lamp on or off.", "parameters": {
    "type": "object", "properties": {"lamp": {"type": "string", "enum": ["desk", "hall"]}, "on": {"type": "boolean"}},
    "required": ["lamp", "on"], "additionalProperties": False}}}


@pytest.fixture
def engine(tiny_model) -> EmbeddedEngine:
    model, tokenizer = tiny_model
    return EmbeddedEngine("tiny", model, tokenizer, max_batch_size=8, seed=0)


def _prompt(engine: EmbeddedEngine) -> list[int]:
    return engine.tokenizer.encode("Is 2 + 2 = 4? Answer in JSON.")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_json_schema_reply_validates_and_its_logprobs_are_the_constrained_distributions(engine, temperature):
    prompt = _prompt(engine)
    params = [SamplingParams(temperature, 1.0, 48, seed=s, constraint=Constraint.json_schema(VERDICT)) for s in range(6)]
    for generation in engine.generate([prompt] * 6, params):
        assert generation.finish_reason == "stop", generation.text
        value = json.loads(generation.text)
        assert list(value) == ["verdict", "sure"] and value["verdict"] in ("approve", "reject")
        assert isinstance(value["sure"], bool)
        under, free = constrained_logprobs(engine.model, engine.tokenizer, prompt, generation.token_ids, temperature,
                                           params[0].constraint, engine._eos_ids)
        assert under.tolist() == pytest.approx(generation.logprobs, abs=1e-4)
        assert (under >= free - 1e-5).all() and (under > free + 1e-3).any()  # renormalised over fewer tokens


def test_a_forced_tool_call_is_one_call_of_the_function_with_valid_arguments(engine):
    constraint = hermes_calls([SWITCH], {"type": "function", "function": {"name": "switch"}}, False)
    generations = engine.generate([_prompt(engine)] * 4, [SamplingParams(1.0, 1.0, 64, seed=s, constraint=constraint)
                                                          for s in range(4)])
    for generation in generations:
        content, calls = parse_hermes(generation.text)
        assert generation.finish_reason == "stop" and content == "" and len(calls) == 1, generation.text
        assert calls[0].name == "switch" and calls[0].arguments["lamp"] in ("desk", "hall")
        assert isinstance(calls[0].arguments["on"], bool)


def test_free_rows_beside_constrained_ones_sample_as_alone_and_bad_constraints_are_refused(engine):
    prompt = _prompt(engine)
    free = SamplingParams(1.0, 1.0, 16, seed=11)
    (alone,) = engine.generate([prompt], [free])
    mixed = engine.generate([prompt] * 3, [SamplingParams(1.0, 1.0, 48, seed=1, constraint=Constraint.json_object()),
                                           free, SamplingParams(0.0, 1.0, 48, constraint=Constraint.json_schema(VERDICT))])
    assert mixed[1].token_ids == alone.token_ids and mixed[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert mixed[0].text.startswith("{") and json.loads(mixed[2].text)["verdict"] in ("approve", "reject")
    for bad, why in ((Constraint("json_schema", "{not json"), "json schema constraint does not compile"),
                     (Constraint("structural_tag", '{"type": "structural_tag", "format": {"type": "nope"}}'),
                      "structural tag constraint does not compile")):
        with pytest.raises(ValueError, match=why):
            engine.generate([prompt], [SamplingParams(constraint=bad)])
    with pytest.raises(ValueError, match="unknown constraint kind 'regex'"):
        Constraint("regex", "a+")
