"""PolicyTrainer on the tiny model: real samples from the engine, real gradients, AdamW steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.core.sample import Sample
from drmas.engines.base import SamplingParams
from drmas.engines.embedded import EmbeddedEngine
from drmas.learner.policy import PolicyTrainer
from drmas.models.loading import load_model


def _samples(model_dir, n=6, temperature=1.0, agents=("solver", "verifier")):
    model, tokenizer = load_model(model_dir)
    engine = EmbeddedEngine("m", model, tokenizer, seed=0)
    prompts = [tokenizer(f"question {i}: how many apples?")["input_ids"] for i in range(n)]
    gens = engine.generate(prompts, [SamplingParams(temperature=temperature, max_new_tokens=8)] * n)
    return [
        Sample(episode_id=f"e{i}", group_id="g", agent=agents[i % len(agents)], model="m", turn=0,
               prompt_ids=p, response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=0,
               temperature=temperature, valid=True, reward=float(i % 2))
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]


def _trainer(model_dir, **alg):
    model, _ = load_model(model_dir)
    return PolicyTrainer("m", model, OptimConfig(lr=1e-2), AlgorithmConfig(micro_batch_size=4, **alg))


def test_update_takes_finite_steps_and_changes_weights(tiny_model_dir):
    samples = _samples(tiny_model_dir)
    trainer = _trainer(tiny_model_dir, optim_steps_per_update=2)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.update(samples, np.array([1.0, -1.0] * 3))
    assert math.isfinite(metrics["loss/m"]) and metrics["grad_norm/m"] > 0
    assert trainer.optimizer_steps == 2 and trainer.skipped_steps == 0
    # learner and engine saw the same weights: on-policy ratio is 1, mismatch only numerical
    assert metrics["mismatch_kl/m"] < 1e-6
    assert metrics["is_ratio/m/max"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["ess/m"] == pytest.approx(1.0, abs=1e-3)  # equal weights: every token counts fully
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_warmup_ramps_the_learning_rate_of_the_steps_it_takes(tiny_model_dir):
    """optim.warmup_steps=4: optimizer step k uses lr*k/4. AdamW's first step moves each weight by about its
    learning rate (m/sqrt(v) = +-1), so the largest change shows the rate the step really used."""
    samples = _samples(tiny_model_dir, n=4)
    moved = {}
    for warmup in (0, 4):
        model, _ = load_model(tiny_model_dir)
        trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-2, weight_decay=0.0, warmup_steps=warmup),
                                AlgorithmConfig(micro_batch_size=4, optim_steps_per_update=1))
        before = [p.detach().clone() for p in trainer.params]
        metrics = trainer.update(samples, np.array([1.0, -1.0, 1.0, -1.0]))
        moved[warmup] = max((p.detach() - b).abs().max().item() for p, b in zip(trainer.params, before))
        assert metrics["lr/m"] == pytest.approx(1e-2 if warmup == 0 else 0.25e-2)
    assert moved[4] / moved[0] == pytest.approx(0.25, rel=1e-3)
    assert [trainer.learning_rate(k) for k in (1, 2, 4, 9)] == pytest.approx([0.25e-2, 0.5e-2, 1e-2, 1e-2])
    trainer.update(samples, np.array([1.0, -1.0, 1.0, -1.0]))
    assert trainer.optimizer_steps == 2 and trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-2)


def test_positive_advantage_raises_logprob_of_sampled_tokens(tiny_model_dir):
    samples = _samples(tiny_model_dir, n=4)
    trainer = _trainer(tiny_model_dir)
    old = torch.cat(trainer.logprobs(samples)).sum()
    trainer.update(samples, np.ones(len(samples)))
    assert torch.cat(trainer.logprobs(samples)).sum() > old


def test_non_finite_gradient_skips_step_and_counts_it(tiny_model_dir):
    samples = _samples(tiny_model_dir, n=4)
    trainer = _trainer(tiny_model_dir)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.update(samples, np.array([np.nan, 1.0, 1.0, 1.0]))
    assert trainer.skipped_steps == 1 and trainer.optimizer_steps == 0
    assert metrics["skipped_steps/m"] == 1
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_micro_batching_matches_one_big_batch(tiny_model_dir):
    """Gradient accumulation over micro-batches gives the token-mean loss of the whole batch."""
    samples = _samples(tiny_model_dir, n=6)
    adv = np.linspace(-1, 1, 6)
    small = _trainer(tiny_model_dir)
    small.alg.micro_batch_size = 2
    big = _trainer(tiny_model_dir)
    big.alg.micro_batch_size = 6
    m_small, m_big = small.update(samples, adv), big.update(samples, adv)
    assert m_small["loss/m"] == pytest.approx(m_big["loss/m"], rel=1e-4, abs=1e-6)
    assert m_small["grad_norm/m"] == pytest.approx(m_big["grad_norm/m"], rel=1e-3)


def test_agent_loss_weight_zero_removes_its_gradient(tiny_model_dir):
    samples = [s for s in _samples(tiny_model_dir, n=4) if s.agent == "verifier"]
    model, _ = load_model(tiny_model_dir)
    trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-2), AlgorithmConfig(), {"verifier": 0.0})
    metrics = trainer.update(samples, np.ones(len(samples)))
    assert metrics["grad_norm/m"] == 0.0


def test_trainer_state_round_trip(tiny_model_dir):
    samples = _samples(tiny_model_dir, n=4)
    trainer = _trainer(tiny_model_dir)
    trainer.update(samples, np.ones(4))
    state = trainer.state_dict()
    other = _trainer(tiny_model_dir)
    other.load_state_dict(state)
    assert other.optimizer_steps == 1
    assert other.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()


def test_ess_share_falls_when_few_tokens_dominate():
    from drmas.learner.policy import _ess_share

    equal = [torch.zeros(4)], [torch.zeros(4)]
    skewed = [torch.tensor([5.0, 0.0, 0.0, 0.0])], [torch.zeros(4)]
    assert _ess_share(*equal) == pytest.approx(1.0)
    assert 0.25 <= _ess_share(*skewed) < 0.3  # one weight e^5 against three of 1: about 1/n


def test_learner_collation_matches_the_engines_logprob_definition(tiny_model_dir):
    """`response_logprobs` (packed arrays, numpy padding) computes what `sequence_logprobs` defines, for
    mixed lengths, temperatures and an empty response."""
    from drmas.engines.logprobs import sequence_logprobs
    from drmas.learner.collate import response_logprobs

    samples = _samples(tiny_model_dir, n=3)
    samples[0].temperature, samples[1].temperature = 0.7, 0.0
    samples[2].response_ids, samples[2].behaviour_logprobs = [], []
    model, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        ours = response_logprobs(model, samples)
        theirs = sequence_logprobs(model, [s.prompt_ids.tolist() for s in samples],
                                   [s.response_ids.tolist() for s in samples], [s.temperature for s in samples])
    assert [len(t) for t in ours] == [len(s.response_ids) for s in samples]
    for mine, expected in zip(ours, theirs):
        torch.testing.assert_close(mine, expected)
