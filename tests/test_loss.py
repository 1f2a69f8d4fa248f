"""Decoupled PPO loss: on-policy reduction, clip regions, dual clip, behaviour weights, degenerate input."""

from __future__ import annotations

import math

import pytest
import torch

from drmas.algorithms.losses import masked_mean
from drmas.algorithms.ppo import ppo_loss


pytestmark = pytest.mark.usefixtures("float64")  # exact hand-computed values (tests/conftest.py)


def _leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, requires_grad=True)


def _single(logprob: float, proximal: float, adv: float, behaviour: float | None = None, **kw: object):
    """Loss, grad and stats for one token, which makes each clip region easy to read off."""
    lp = _leaf([[logprob]])
    prox = torch.tensor([[proximal]])
    behav = torch.tensor([[proximal if behaviour is None else behaviour]])
    loss, stats = ppo_loss(lp, prox, behav, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), float(lp.grad[0, 0]), stats


def test_on_policy_is_vanilla_policy_gradient() -> None:
    lp = _leaf([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5])
    loss, stats = ppo_loss(lp, lp.detach(), lp.detach(), adv, mask)
    loss.backward()
    n = 5
    assert loss.item() == pytest.approx(-(3 * 1.5 + 2 * -0.5) / n)
    expected_grad = -adv.unsqueeze(-1).expand(2, 3) * mask / n
    torch.testing.assert_close(lp.grad, expected_grad)
    assert stats["ratio_mean"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["clip_fraction"] == 0.0 and stats["dual_clip_fraction"] == 0.0
    assert stats["is_weight_mean"] == 1.0 and stats["approx_kl"] == 0.0


def test_per_token_advantages_are_accepted() -> None:
    lp = _leaf([[-1.0, -2.0]])
    adv = torch.tensor([[1.0, 3.0]])
    loss, _ = ppo_loss(lp, lp.detach(), lp.detach(), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(-2.0)


def test_positive_advantage_above_clip_has_no_gradient() -> None:
    loss, grad, stats = _single(math.log(1.5), 0.0, adv=2.0)
    assert loss == pytest.approx(-2.0 * 1.2) and grad == 0.0 and stats["clip_fraction"] == 1.0


def test_positive_advantage_inside_region_has_gradient() -> None:
    loss, grad, stats = _single(math.log(1.1), 0.0, adv=2.0)
    assert loss == pytest.approx(-2.2) and grad == pytest.approx(-2.2) and stats["clip_fraction"] == 0.0


def test_negative_advantage_below_clip_has_no_gradient() -> None:
    loss, grad, stats = _single(math.log(0.5), 0.0, adv=-1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0 and stats["clip_fraction"] == 1.0


def test_dual_clip_bounds_negative_advantage_with_exploding_ratio() -> None:
    loss, grad, stats = _single(math.log(5.0), 0.0, adv=-1.0)
    assert loss == pytest.approx(3.0) and grad == 0.0
    assert stats["dual_clip_fraction"] == 1.0 and stats["ratio_max"] == pytest.approx(5.0)
    # without the dual clip the unbounded term -A * ratio is used, with its gradient
    loss, grad, stats = _single(math.log(5.0), 0.0, adv=-1.0, dual_clip=None)
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0) and stats["dual_clip_fraction"] == 0.0


def test_dual_clip_is_inactive_between_clip_and_dual_bound() -> None:
    loss, grad, stats = _single(math.log(2.0), 0.0, adv=-1.0)
    assert loss == pytest.approx(2.0) and grad == pytest.approx(2.0) and stats["dual_clip_fraction"] == 0.0


def test_behaviour_importance_weight_scales_loss_and_can_be_capped() -> None:
    # proximal / behaviour = e^1: a sample from an older policy that the proximal policy now prefers
    loss, grad, stats = _single(0.0, 0.0, adv=1.0, behaviour=-1.0)
    assert loss == pytest.approx(-math.e) and grad == pytest.approx(-math.e)
    assert stats["is_weight_mean"] == pytest.approx(math.e) and stats["is_weight_max"] == pytest.approx(math.e)
    loss, _, stats = _single(0.0, 0.0, adv=1.0, behaviour=-1.0, max_is_weight=2.0)
    assert loss == pytest.approx(-2.0) and stats["is_weight_max"] == 2.0


def test_nonfinite_behaviour_logprob_is_zeroed_and_counted() -> None:
    lp = _leaf([[-1.0, -1.0, -1.0]])
    behav = torch.tensor([[-1.0, float("nan"), -1.0]])
    # a nan at a masked-out (padding) position is not counted
    behav_pad = torch.tensor([[-1.0, float("nan"), float("nan")]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = ppo_loss(lp, lp.detach(), behav, torch.tensor([1.0]), torch.ones(1, 3))
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(-2.0 / 3.0)
    assert torch.isfinite(lp.grad).all() and stats["nonfinite_is_weight"] == 1.0
    _, stats = ppo_loss(lp, lp.detach(), behav_pad, torch.tensor([1.0]), mask)
    assert stats["nonfinite_is_weight"] == 1.0


def test_padding_garbage_does_not_leak() -> None:
    lp = _leaf([[-1.0, float("-inf")]])
    prox = torch.tensor([[-1.0, float("nan")]])
    adv = torch.tensor([[2.0, float("nan")]])
    loss, stats = ppo_loss(lp, prox, prox, adv, torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-2.0)
    assert torch.isfinite(lp.grad).all() and all(math.isfinite(v) for v in stats.values())


def test_empty_mask_gives_zero_loss_that_backpropagates() -> None:
    lp = _leaf([[-1.0, -2.0]])
    loss, stats = ppo_loss(lp, lp.detach(), lp.detach(), torch.tensor([1.0]), torch.zeros(1, 2))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(1, 2))
    assert stats["ratio_max"] == 0.0 and stats["clip_fraction"] == 0.0


def test_aggregations() -> None:
    lp = _leaf([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    adv = torch.tensor([1.0, 4.0, 100.0])  # the empty third sequence must not count
    args = (lp, lp.detach(), lp.detach(), adv, mask)
    assert ppo_loss(*args, aggregation="token-mean")[0].item() == pytest.approx(-(3 + 4) / 4)
    assert ppo_loss(*args, aggregation="seq-mean-token-mean")[0].item() == pytest.approx(-(1 + 4) / 2)
    assert ppo_loss(*args, aggregation="seq-mean-token-sum")[0].item() == pytest.approx(-(3 + 4) / 2)


def test_approx_kl_is_k3_estimator() -> None:
    lp = torch.tensor([[math.log(1.1), math.log(0.9)]])
    _, stats = ppo_loss(lp, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([0.0]), torch.ones(1, 2))
    expected = ((0.1 - math.log(1.1)) + (-0.1 - math.log(0.9))) / 2
    assert stats["approx_kl"] == pytest.approx(expected) and stats["approx_kl"] > 0


def test_masked_mean() -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert float(masked_mean(x, mask)) == 1.5
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 0.0]))


def test_validation() -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="aggregation"):
        ppo_loss(lp, lp, lp, torch.zeros(2), torch.ones(2, 3), aggregation="sum")
    with pytest.raises(ValueError, match="mask"):
        ppo_loss(lp, lp, lp, torch.zeros(2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="advantages"):
        ppo_loss(lp, lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_loss(lp, lp, lp, torch.zeros(2), torch.ones(2, 3), dual_clip=0.5)
