"""The embedded engine on the tiny random model: limits, stops, determinism, log-probs, weight updates."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from drmas.engines import ENGINES, Engine
from drmas.engines.base import SamplingParams
from drmas.engines.embedded import EmbeddedEngine, sample_tokens
from drmas.engines.logprobs import sequence_logprobs

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture
def engine(tiny_model) -> EmbeddedEngine:
    model, tokenizer = tiny_model
    return EmbeddedEngine("tiny", model, tokenizer, max_batch_size=4, seed=0)


def _prompts(engine: EmbeddedEngine, n: int = 6) -> list[list[int]]:
    """Prompts of different lengths, so batches need padding."""
    texts = ["Hi", "What is 2 + 2?", "Tell me a story about a cat", "x", "The answer is", "Count: 1, 2, 3, 4, 5, 6"]
    return [engine.tokenizer.encode(texts[i % len(texts)] + " " * (i // len(texts))) for i in range(n)]


def _greedy_tokens(engine: EmbeddedEngine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [g.token_ids for g in engine.generate(prompts, [params] * len(prompts))]


def test_implements_protocol_and_is_registered(tiny_model_dir: Path) -> None:
    engine = ENGINES.get("embedded")("m", tiny_model_dir, "float32", 8, 0)
    assert isinstance(engine, EmbeddedEngine) and isinstance(engine, Engine)
    assert engine.version == 0


def test_respects_max_new_tokens_per_row(engine: EmbeddedEngine) -> None:
    prompts = _prompts(engine, 4)
    limits = [1, 5, 0, 9]
    params = [SamplingParams(max_new_tokens=n) for n in limits]
    gens = engine.generate(prompts, params)
    for gen, limit in zip(gens, limits):
        assert len(gen.token_ids) == len(gen.logprobs) <= limit
        if gen.finish_reason == "length":
            assert len(gen.token_ids) == limit
        assert gen.version == 0


def test_logprobs_finite_and_not_positive(engine: EmbeddedEngine) -> None:
    params = [SamplingParams(temperature=t, top_p=p, max_new_tokens=8) for t, p in [(1.0, 1.0), (0.5, 0.9), (0.0, 1.0)]]
    for gen in engine.generate(_prompts(engine, 3), params):
        assert gen.logprobs and all(math.isfinite(lp) and lp <= 0 for lp in gen.logprobs)


def test_greedy_is_deterministic_and_batch_independent(engine: EmbeddedEngine) -> None:
    prompts = _prompts(engine)
    batched = _greedy_tokens(engine, prompts)
    assert batched == _greedy_tokens(engine, prompts)
    assert [_greedy_tokens(engine, [p])[0] for p in prompts] == batched


def test_seeded_sampling_reproducible_whatever_the_batch(engine: EmbeddedEngine) -> None:
    prompts = _prompts(engine)
    seeded = SamplingParams(temperature=1.0, max_new_tokens=10, seed=1234)
    other = SamplingParams(temperature=1.0, max_new_tokens=10)
    alone = engine.generate([prompts[2]], [seeded])[0].token_ids
    mixed = engine.generate(prompts, [other, other, seeded, other, other, other])[2].token_ids
    assert alone == mixed
    different = engine.generate([prompts[2]], [SamplingParams(temperature=1.0, max_new_tokens=10, seed=99)])[0]
    assert different.token_ids != alone


def test_engine_seed_makes_runs_reproducible(tiny_model) -> None:
    model, tokenizer = tiny_model
    params = [SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8)] * 3

    def run(seed: int) -> list[list[int]]:
        engine = EmbeddedEngine("tiny", model, tokenizer, seed=seed)
        return [g.token_ids for g in engine.generate(_prompts(engine, 3), params)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_stop_string_ends_generation_and_is_kept(engine: EmbeddedEngine) -> None:
    prompt = _prompts(engine)[2]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)  # varied text, same draws each run
    full = engine.generate([prompt], [sampling])[0].token_ids
    decode = engine.tokenizer.decode
    # Pick a token whose text first appears at position k: generation must then end right after it.
    k, stop = next(
        (k, decode([full[k]]))
        for k in range(2, len(full))
        if len(decode([full[k]]).strip()) >= 2 and decode([full[k]]) not in decode(full[:k])
    )
    gen = engine.generate([prompt], [dataclasses.replace(sampling, stop=("@@never@@", stop))])[0]
    assert gen.finish_reason == "stop"
    assert gen.token_ids == full[: k + 1]
    assert gen.text.endswith(stop)


def test_eos_ends_generation_and_is_left_out_of_text(tiny_model) -> None:
    model, tokenizer = tiny_model
    probe = EmbeddedEngine("tiny", model, tokenizer)
    prompt = _prompts(probe, 1)
    first = _greedy_tokens(probe, prompt)[0]
    # Declare the 3rd greedy token an EOS: generation stops there, keeps its id, drops it from the text.
    engine = EmbeddedEngine("tiny", model, tokenizer, eos_token_ids={first[2]})
    gen = engine.generate(prompt, [GREEDY])[0]
    assert gen.finish_reason == "stop"
    assert gen.token_ids == first[: first.index(first[2]) + 1]
    assert gen.text == tokenizer.decode(gen.token_ids[:-1])


def test_engine_logprobs_match_sequence_logprobs(engine: EmbeddedEngine) -> None:
    """The behaviour log-probs must be what the learner recomputes on the same weights."""
    prompts = _prompts(engine)
    settings = [(1.0, 1.0, 10), (0.7, 0.8, 4), (0.0, 1.0, 7), (1.3, 1.0, 10), (1.0, 0.5, 2), (0.9, 1.0, 6)]
    params = [SamplingParams(temperature=t, top_p=p, max_new_tokens=n) for t, p, n in settings]
    gens = engine.generate(prompts, params)  # 6 rows > max_batch_size 4; rows finish at different steps
    with torch.no_grad():
        expected = sequence_logprobs(engine.model, prompts, [g.token_ids for g in gens], [t for t, _, _ in settings])
    diff = max((e - torch.tensor(g.logprobs)).abs().max().item() for e, g in zip(expected, gens))
    assert diff < 1e-4


def test_sequence_logprobs_has_gradients(tiny_model) -> None:
    model, tokenizer = tiny_model
    out = sequence_logprobs(model, [[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], temperature=0.8)
    assert [len(t) for t in out] == [2, 3]
    torch.stack([t.sum() for t in out]).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None


def test_load_weights_changes_outputs_and_version(engine: EmbeddedEngine) -> None:
    prompts = _prompts(engine, 3)
    before = engine.generate(prompts, [GREEDY] * 3)
    scaled = [(name, t * 3.0) for name, t in engine.state_dict_tensors()]
    engine.load_weights(scaled, version=5, incarnation="learner-x")
    after = engine.generate(prompts, [GREEDY] * 3)
    assert all(g.incarnation == "" for g in before)
    assert engine.version == 5 and all(g.version == 5 and g.incarnation == "learner-x" for g in after)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]


def test_load_weights_same_weights_same_outputs(engine: EmbeddedEngine) -> None:
    prompts = _prompts(engine, 3)
    before = engine.generate(prompts, [GREEDY] * 3)
    engine.load_weights([(n, t.clone()) for n, t in engine.state_dict_tensors()], version=1)
    after = engine.generate(prompts, [GREEDY] * 3)
    assert [g.token_ids for g in after] == [g.token_ids for g in before]
    assert [g.logprobs for g in after] == [g.logprobs for g in before]


def test_load_weights_accepts_tied_alias_and_keeps_storage(engine: EmbeddedEngine) -> None:
    embed = engine.model.model.embed_tokens.weight
    pointer = embed.data_ptr()
    engine.load_weights([("lm_head.weight", torch.zeros_like(embed))], version=2)
    assert embed.data_ptr() == pointer and float(embed.detach().abs().sum()) == 0.0


def test_load_weights_unknown_name_raises_key_error(engine: EmbeddedEngine) -> None:
    with pytest.raises(KeyError, match="not.a.weight"):
        engine.load_weights([("not.a.weight", torch.zeros(1))], version=3)
    assert engine.version == 0


def test_load_weights_shape_mismatch_raises_value_error(engine: EmbeddedEngine) -> None:
    name, tensor = next(iter(engine.state_dict_tensors()))
    with pytest.raises(ValueError, match=name):
        engine.load_weights([(name, torch.zeros(tensor.shape[0] + 1))], version=3)


def test_batch_larger_than_max_batch_size(engine: EmbeddedEngine) -> None:
    prompts = _prompts(engine, 11)
    gens = engine.generate(prompts, [SamplingParams(temperature=0.0, max_new_tokens=3)] * 11)
    assert len(gens) == 11
    assert [g.token_ids for g in gens] == [_greedy_tokens(engine, [p], SamplingParams(0.0, max_new_tokens=3))[0] for p in prompts]


def test_rejects_empty_prompt(engine: EmbeddedEngine) -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], [GREEDY])


def test_top_p_restricts_to_nucleus_but_logprob_uses_full_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(2000, 1)
    uniforms = torch.rand(2000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    tokens, logps = sample_tokens(logits, torch.ones(2000), torch.full((2000,), 0.7), uniforms)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 < 0.7 needs the second token; nothing more
    assert abs((tokens == 0).float().mean().item() - 0.5 / 0.8) < 0.05
    assert torch.allclose(logps, probs.log()[tokens], atol=1e-6)


def _chi_square_p(tokens: list[int], expected: torch.Tensor) -> tuple[float, int]:
    """Pearson's chi-square goodness of fit of `tokens` to the distribution `expected`: tokens expected >= 5 times
    are their own bins, the rest one bin. Returns (p-value, bins)."""
    counts = torch.bincount(torch.tensor(tokens), minlength=expected.numel()).double()
    want = expected.double() * len(tokens)
    own = want >= 5
    observed = torch.cat([counts[own], counts[~own].sum().view(1)])
    wanted = torch.cat([want[own], want[~own].sum().view(1)])
    statistic = float(((observed - wanted) ** 2 / wanted.clamp(min=1e-12)).sum())
    dof = len(wanted) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2))), len(wanted)


def test_sampled_tokens_follow_the_tempered_and_truncated_softmax_in_one_mixed_batch(tiny_model):
    """The sampler draws from softmax(logits / T), truncated to the top-p nucleus, row by row: 2000 one-token samples
    per setting, the settings mixed in the same batches, fit the distribution computed from the model's logits
    (chi-square p > 0.001; seeded, so the outcome is fixed), and the same test rejects a 20% temperature error.
    The tiny model's head is sharpened so that its distribution has bins to test."""
    model, tokenizer = tiny_model
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)
    engine = EmbeddedEngine("tiny", model, tokenizer, max_batch_size=64, seed=0)
    prompt = tokenizer.encode("The answer is")
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()

    def distribution(temperature: float, top_p: float) -> torch.Tensor:
        p = torch.softmax(logits / temperature, -1)
        ordered, order = p.sort(descending=True)
        kept = torch.zeros_like(p)
        kept[order[(ordered.cumsum(0) - ordered) < top_p]] = 1.0
        return p * kept / (p * kept).sum()

    settings = [(0.6, 1.0), (0.55, 1.0), (0.6, 0.8)]
    n = 2000
    params = [SamplingParams(*settings[i % 3][:2], max_new_tokens=1) for i in range(3 * n)]
    tokens = [g.token_ids[0] for g in engine.generate([prompt] * len(params), params)]
    for k, (temperature, top_p) in enumerate(settings):
        drawn = tokens[k::3]
        p_value, bins = _chi_square_p(drawn, distribution(temperature, top_p))
        assert p_value > 1e-3 and bins >= 3, (temperature, top_p, p_value, bins)
        wrong, _ = _chi_square_p(drawn, distribution(temperature * 0.8, top_p))
        assert wrong < 1e-6, (temperature, top_p, wrong)
