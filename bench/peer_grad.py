"""Same-batch parity with TRL: drmas's GRPO gradient and TRL's on one batch, from the same weights.

The training curves of `bench/peer.py parity` can agree only in distribution: the two frameworks sample their
completions from different random streams, so seed by seed they train on different batches. This check takes
that noise out. drmas samples one step's batch (the config's problems for the seed, `group_size` completions
each, its embedded engine) and computes its `global` advantages; then both frameworks compute the policy loss and
its gradient on exactly those completions and advantages, from the same float32 weights:
- drmas: `PolicyTrainer.update` as training runs it (micro-batches, token-mean over the step), with the optimizer
  step replaced by a copy of the gradient and clipping off, so nothing changes and the raw gradient is seen;
- TRL: `GRPOTrainer._compute_loss` (loss_type dapo, what `bench/peer_trl.py` configures) per completion, over the
  whole batch's token count, its gradients summed.
Reported: the loss of each, the relative difference and cosine of the two gradients, their norms, the largest
per-token log-prob difference, and TRL's own advantages ((r - mean) / (std + 1e-4), unbiased std) against
drmas's. Agreement to float error says the two compute the same GRPO update on the same data.

    python bench/peer.py grad --out runs/peer_grad [--seeds 3]
"""

from __future__ import annotations

import math

import numpy as np


def same_batch(config: str, seed: int, overrides: list[str], out: str) -> dict:
    """Both gradients on drmas's first batch for `seed`; the figures of their comparison."""
    import torch

    from drmas.algorithms import AdvantageBatch, estimate
    from drmas.algorithms.running_stats import AgentRewardStats
    from drmas.assembly import load_config
    from drmas.colocated import ColocatedRun
    from drmas.episodes import EpisodeRequest
    from peer_trl import trl_trainer

    cfg = load_config(config, [*overrides, f"trainer.seed={seed}", "trainer.steps=1", f"trainer.output_dir={out}/drmas",
                               "trainer.overwrite=true", "logging.tensorboard=false", "logging.console_every=0"])
    run = ColocatedRun(cfg, log=lambda *_: None)
    problems = run.sampler.next(cfg.rollout.prompts_per_step)
    requests = [EpisodeRequest(f"g{gi}-e{ei}", f"g{gi}", p) for gi, p in enumerate(problems)
                for ei in range(cfg.rollout.group_size)]
    samples = [s for r in run.runner.run(requests) for s in r.samples]
    adv = estimate(AdvantageBatch.from_samples(samples), cfg.algorithm, AgentRewardStats())
    (model_id, trainer), = run.trainers.items()
    drmas_grad, drmas_metrics = _drmas_gradient(trainer, samples, adv)

    trl, _, _, _ = trl_trainer(config, seed, 1, overrides, f"{out}/trl")
    trl.model.eval()  # no dropout either way; "eval" mode also makes the loss's normaliser the token count given
    trl_grad, trl_loss, trl_logps = _trl_gradient(trl, samples, adv, cfg.rollout.temperature)
    drmas_logps = trainer.logprobs(samples)
    names = [n for n, _ in trainer.model.named_parameters()]
    d = torch.cat([drmas_grad[n].flatten() for n in names]).double()  # float64: 135M terms per dot product
    t = torch.cat([trl_grad[n].flatten() for n in names]).double()
    rewards = np.array([s.reward for s in samples])
    groups = np.array([s.group_id for s in samples])
    trl_adv = np.empty_like(rewards)
    for g in np.unique(groups):
        r = torch.tensor(rewards[groups == g])
        trl_adv[groups == g] = ((r - r.mean()) / (r.std() + 1e-4)).numpy()
    spread = [g for g in np.unique(groups) if rewards[groups == g].std() > 0]
    return {
        "seed": seed, "samples": len(samples), "tokens": int(sum(len(s.response_ids) for s in samples)),
        "groups_with_spread": len(spread), "reward_mean": float(rewards.mean()),
        "loss": {"drmas": drmas_metrics[f"loss/{model_id}"], "trl": trl_loss},
        "grad_norm": {"drmas": float(d.norm()), "trl": float(t.norm())},
        "grad_rel_diff": float((d - t).norm() / t.norm()) if float(t.norm()) > 0 else math.nan,
        "grad_cosine": float(torch.nn.functional.cosine_similarity(d, t, dim=0)),
        "logp_max_abs_diff": max(float((a - b).abs().max()) for a, b in zip(drmas_logps, trl_logps)),
        "advantage_max_abs_diff": float(np.max(np.abs(np.asarray(adv) - trl_adv))),
    }


def _drmas_gradient(trainer, samples, adv):
    """The raw gradient of drmas's update on `samples`: clipping off, the optimizer step a copy of the gradients."""
    import dataclasses

    trainer.optim_cfg = dataclasses.replace(trainer.optim_cfg, grad_clip=0.0)
    seen: dict = {}

    def keep() -> None:
        seen.update({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = keep
    metrics = trainer.update(samples, np.asarray(adv))
    return seen, metrics


def _trl_gradient(trainer, samples, adv, temperature: float):
    """TRL's loss and gradient on the same completions: one row at a time (no padding), normalised by the whole
    batch's completion tokens as its dapo loss is, so the summed gradient is the batch's."""
    import torch

    model = trainer.model
    model.zero_grad(set_to_none=True)
    total = torch.tensor(float(sum(len(s.response_ids) for s in samples)))
    loss_sum, logps = 0.0, []
    for sample, a in zip(samples, adv):
        prompt = torch.as_tensor(np.asarray(sample.prompt_ids, dtype=np.int64))[None]
        completion = torch.as_tensor(np.asarray(sample.response_ids, dtype=np.int64))[None]
        inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
                  "completion_mask": torch.ones_like(completion), "advantages": torch.tensor([float(a)]),
                  "num_items_in_batch": total}
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        loss_sum += loss.detach().item()
        with torch.no_grad():
            ids = torch.cat([prompt, completion], dim=1)
            lp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), completion.size(1))
        logps.append(lp[0])
    assert trainer.temperature == temperature, (trainer.temperature, temperature)
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}, loss_sum, logps


def grad_table(runs: list[dict]) -> str:
    """One row per seed: both losses, both gradient norms, their relative difference and cosine."""
    lines = ["| seed | completions (tokens) | groups with spread | loss drmas / TRL | grad norm drmas / TRL | "
             "grad rel. diff | grad cosine | max log-prob diff | max advantage diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['seed']} | {r['samples']} ({r['tokens']}) | {r['groups_with_spread']} | "
                     f"{r['loss']['drmas']:+.6f} / {r['loss']['trl']:+.6f} | "
                     f"{r['grad_norm']['drmas']:.5f} / {r['grad_norm']['trl']:.5f} | {r['grad_rel_diff']:.2e} | "
                     f"{r['grad_cosine']:.6f} | {r['logp_max_abs_diff']:.2e} | {r['advantage_max_abs_diff']:.2e} |")
    return "\n".join(lines)
