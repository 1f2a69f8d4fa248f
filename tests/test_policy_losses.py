"""GSPO and CISPO against hand-computed values and gradients, and the loss registry's contract.

(The decoupled PPO loss has its own file, tests/test_loss.py.)
"""

from __future__ import annotations

import math

import pytest
import torch

from drmas.algorithms import POLICY_LOSSES, LossInputs, LossOutput, policy_loss
from drmas.config.schema import AlgorithmConfig


pytestmark = pytest.mark.usefixtures("float64")  # exact hand-computed values (tests/conftest.py)


def _run(loss: str, logprobs, proximal, adv, behaviour=None, mask=None, **alg: object):
    lp = torch.tensor(logprobs, requires_grad=True)
    prox = torch.tensor(proximal)
    behav = prox.clone() if behaviour is None else torch.tensor(behaviour)
    m = torch.ones_like(prox) if mask is None else torch.tensor(mask)
    out = policy_loss(LossInputs(lp, prox, behav, torch.tensor(adv), m), AlgorithmConfig(loss=loss, **alg))
    out.loss.backward()
    return out, lp.grad


def _flat(rows):
    return [x for row in rows for x in row]


def test_the_built_ins_are_registered():
    assert POLICY_LOSSES.names() == ["cispo", "gspo", "ppo"]


def test_gspo_inside_the_clip_is_the_sequence_ratio_times_the_advantage():
    # log-ratios 0.1 and 0.2: s = exp(0.15); d(-s A)/d logp_t = -s A / 2 for each of the 2 tokens
    out, grad = _run("gspo", [[-1.0, -2.0]], [[-1.1, -2.2]], [1.0], clip_high=0.2)
    s = math.exp(0.15)
    assert out.per == "sequence" and out.loss.item() == pytest.approx(-s)
    assert grad.flatten().tolist() == pytest.approx(_flat([[-s / 2, -s / 2]]))
    assert out.stats["clip_fraction"] == 0.0 and out.stats["ratio_mean"] == pytest.approx(s)


def test_gspo_clips_the_sequence_not_its_tokens():
    # a token ratio of exp(0.3) is outside a 0.2 clip, but the sequence's exp(0.15) is inside: nothing clipped
    out, grad = _run("gspo", [[-1.0, -2.0]], [[-1.0, -2.3]], [1.0], clip_high=0.2)
    assert out.stats["clip_fraction"] == 0.0 and grad.abs().min() > 0
    # past the clip (0.1), a positive advantage has no gradient
    out, grad = _run("gspo", [[-1.0, -2.0]], [[-1.1, -2.2]], [1.0], clip_high=0.1)
    assert out.loss.item() == pytest.approx(-1.1) and grad.abs().max() == 0.0 and out.stats["clip_fraction"] == 1.0


def test_gspo_averages_sequences_and_weighs_the_behaviour_gap_per_sequence():
    # seq 0: one token on-policy, A=1; seq 1: two tokens (one padding), A=-1, behaviour 0.2 below proximal
    out, grad = _run("gspo", [[-1.0, 0.0], [-2.0, -7.0]], [[-1.0, 0.0], [-2.0, 9.0]], [1.0, -1.0],
                     behaviour=[[-1.0, 0.0], [-2.2, 5.0]], mask=[[1.0, 0.0], [1.0, 0.0]])
    w = math.exp(0.2)
    assert out.loss.item() == pytest.approx((-1.0 + w) / 2)
    assert grad.flatten().tolist() == pytest.approx(_flat([[-0.5, 0.0], [w / 2, 0.0]]))
    assert out.stats["is_weight_max"] == pytest.approx(w)


def test_cispo_keeps_the_gradient_of_a_token_ppo_would_clip():
    # ratio exp(0.5) = 1.65 > 1.2: PPO zeroes this token's gradient, CISPO weighs it by 1.2
    out, grad = _run("cispo", [[-1.0]], [[-1.5]], [2.0], clip_high=0.2)
    assert out.loss.item() == pytest.approx(-2.4) and grad.item() == pytest.approx(-2.4)
    assert out.stats["clip_fraction"] == 1.0
    ppo, ppo_grad = _run("ppo", [[-1.0]], [[-1.5]], [2.0], clip_high=0.2)
    assert ppo_grad.item() == 0.0


def test_cispo_bounds_the_weight_from_below_too_and_is_plain_pg_on_policy():
    out, grad = _run("cispo", [[-2.0]], [[-1.0]], [-1.0], clip_low=0.2)  # ratio exp(-1) = 0.37 -> 0.8
    assert grad.item() == pytest.approx(0.8)
    out, grad = _run("cispo", [[-1.0, -2.0, -0.5]], [[-1.0, -2.0, -0.5]], [1.5])  # token-mean of -A grad log pi
    assert out.per == "token" and grad.flatten().tolist() == pytest.approx([-0.5, -0.5, -0.5])


@pytest.mark.parametrize("loss", ["ppo", "gspo", "cispo"])
def test_every_loss_is_the_policy_gradient_on_policy_and_zero_on_an_empty_mask(loss):
    out, grad = _run(loss, [[-1.0, -2.0]], [[-1.0, -2.0]], [2.0])
    assert grad.flatten().tolist() == pytest.approx([-1.0, -1.0])  # -A / 2 per token: a mean over the 2 tokens
    out, grad = _run(loss, [[-1.0, -2.0]], [[-1.0, -2.0]], [2.0], mask=[[0.0, 0.0]])
    assert out.loss.item() == 0.0 and grad.abs().max() == 0.0


@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_a_non_finite_behaviour_log_prob_is_zeroed_and_counted(loss):
    out, grad = _run(loss, [[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], behaviour=[[-math.inf, -2.0]])
    assert math.isfinite(out.loss.item()) and torch.isfinite(grad).all()
    assert out.stats["nonfinite_is_weight"] >= 1


def test_a_plugin_loss_is_chosen_by_name_and_its_output_checked(monkeypatch):
    def reinforce(inputs: LossInputs, alg: AlgorithmConfig) -> LossOutput:
        m = inputs.mask.bool()
        return LossOutput(-(inputs.advantages * inputs.logprobs)[m].mean(), {}, "token")

    monkeypatch.setitem(POLICY_LOSSES._items, "reinforce", reinforce)
    monkeypatch.setitem(POLICY_LOSSES._items, "broken", lambda inputs, alg: (inputs.logprobs.sum(), {}))
    out, grad = _run("reinforce", [[-1.0, -2.0]], [[-1.0, -2.0]], [[2.0, 2.0]])
    assert grad.flatten().tolist() == pytest.approx(_flat([[-1.0, -1.0]]))
    with pytest.raises(TypeError, match="'broken' must return a LossOutput"):
        _run("broken", [[-1.0]], [[-1.0]], [1.0])
    with pytest.raises(ValueError, match="algorithm.loss: 'trpo' is not a registered policy loss"):
        _run("trpo", [[-1.0]], [[-1.0]], [1.0])


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="proximal_logprobs has shape"):
        _run("gspo", [[-1.0, -2.0]], [[-1.0]], [1.0])
