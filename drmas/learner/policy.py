"""One trained model: its optimiser and the decoupled-PPO update over a batch of samples.

The update recomputes the proximal log-probs (this model's weights before the update) once, splits the
batch into `optim_steps_per_update` optimizer steps, accumulates gradients over micro-batches so that the
aggregate equals the loss over the whole step, and skips (and counts) a step whose gradient is not finite.

The same update runs on one process or on N data-parallel ranks of one model (`ranks`, see
`drmas.learner.ranks.single` and `drmas.learner.ranks.sharding`): every rank is given the whole batch, trains on its
share of each step, and normalises by the whole step, so the metrics and weights agree across ranks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.nn.utils.rnn import pad_sequence

from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.core.sample import Sample
from drmas.learner.collate import float_rows, response_logprobs
from drmas.algorithms.losses import LossInputs, policy_loss
from drmas.learner.ranks.single import SingleRank
from drmas.models import adapters
from drmas.models.devices import compute_autocast, exact_float32
from drmas.weights.learner.source import WeightSource


_STOPPED = "asked to stop before the update's first optimizer step"


class UpdateStopped(Exception):
    """The update was abandoned at a safe point (asked to stop before its first optimizer step): weights,
    optimizer state and step counters are as before it; the caller decides what happens to the batch."""


class PolicyTrainer:
    """Owns the trainable copy of one model and its AdamW state; or, with `adapter`, one LoRA adapter of a
    peft model and its AdamW state (the base frozen, possibly shared with the trainers of its other adapters:
    each forward pass activates this trainer's adapter first)."""

    def __init__(
        self,
        model_id: str,
        model: torch.nn.Module,
        optim: OptimConfig,
        algorithm: AlgorithmConfig,
        agent_loss_weights: Mapping[str, float] | None = None,
        ranks: SingleRank | None = None,
        compute_dtype: torch.dtype | None = None,
        adapter: str | None = None,
        export_merged: bool = False,
        activation_checkpointing: bool = False,
    ) -> None:
        """`compute_dtype`: what the forward passes compute in (the precision contract of `drmas.models.devices`;
        default: the parameters' dtype). `adapter`: `model` is a peft model and only this adapter of it is
        trained, pushed and checkpointed (in peft's format, plus the base with it merged in when
        `export_merged`). ``activation_checkpointing``: recompute each decoder layer's activations in the
        backward pass (`checkpoint_layers`) instead of keeping every layer's from the forward (the learner
        passes `models.<id>.activation_checkpointing`)."""
        self.model_id = model_id
        self.adapter = adapter
        self.export_merged = export_merged
        self.ranks = ranks or SingleRank()
        if activation_checkpointing:
            checkpoint_layers(model, f"models.{model_id}.activation_checkpointing")
        self.model = self.ranks.prepare(model)  # sharded before the optimizer sees the parameters
        self.model.train()
        first = next(model.parameters())
        self.device = first.device  # the master weights' device and dtype
        self.compute_dtype = compute_dtype or first.dtype
        # what pushes send floating-point tensors in: the engines' dtype; an adapter's as it is trained (a few MB:
        # rounding it to a bfloat16 engine's dtype would save little and cost the two sides' agreement)
        self.push_dtype = None if adapter is not None else self.compute_dtype
        self._compute = lambda: compute_autocast(self.device, first.dtype, self.compute_dtype)
        exact_float32(self.device)
        self.optim_cfg = optim
        self.alg = algorithm
        self.agent_loss_weights = dict(agent_loss_weights or {})
        if adapter is not None:
            self.params = list(adapters.adapter_parameters(model, adapter).values())
            self._own = adapters.adapter_fqns(model, adapter)
        else:
            self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, weight_decay=optim.weight_decay
        )
        self.skipped_steps = 0
        self.optimizer_steps = 0

    def learning_rate(self, step: int) -> float:
        """The learning rate of optimizer step `step` (1-based): a linear warm-up over `optim.warmup_steps`,
        then `optim.lr`. A function of the step count, which checkpoints keep, so a resumed run goes on
        with the ramp where it was."""
        warmup = self.optim_cfg.warmup_steps
        return self.optim_cfg.lr * (min(1.0, step / warmup) if warmup > 0 else 1.0)

    def _autocast(self):
        """The context of every forward pass: this trainer's adapter active, in the compute dtype."""
        if self.adapter is not None:
            adapters.use_adapter(self.model, self.adapter)
        return self._compute()

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The current weights by name, as an engine's `load_weights` takes them (whole, also when sharded);
        an adapter's: its tensors under peft's saved names (an engine's `load_adapter` takes them)."""
        if self.adapter is not None:
            yield from adapters.AdapterTensors(self.model, self.adapter).named()
            return
        yield from self.ranks.full_tensors(self.model)

    def weight_source(self, before_pass: Callable[[], None] | None = None) -> WeightSource:
        """The current weights as pushes and checkpoints stream them (`SingleRank.weight_source`); an
        adapter's tensors only (`AdapterTensors`)."""
        if self.adapter is not None:
            return adapters.AdapterTensors(self.model, self.adapter)
        return self.ranks.weight_source(self.model, before_pass)

    def saveable(self, source: WeightSource, tokenizer=None):
        """What a checkpoint's model directory is written from (`save_pretrained`): the model (or its streamed
        weights, sharded), or the adapter in peft's format (`AdapterExport`)."""
        if self.adapter is not None:
            return adapters.AdapterExport(self.model, self.adapter, tokenizer, merged=self.export_merged)
        return self.ranks.saveable(self.model, source)

    @torch.no_grad()
    def logprobs(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Learner log-probs of every response token (no gradient), in sample order."""
        out: list[torch.Tensor | None] = [None] * len(samples)
        for idx, micro in self._micro_batches(samples):
            with self._autocast():
                lps = response_logprobs(self.model, micro)
            for i, lp in zip(idx, lps):
                out[i] = lp.detach().float()
        return out  # type: ignore[return-value]

    def update(
        self, samples: Sequence[Sample], advantages: np.ndarray, version: int | None = None,
        should_stop: Callable[[], bool] | None = None, before_step: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """Take `optim_steps_per_update` optimizer steps on these samples; returns metrics named per model.

        The proximal policy is these weights before the update. The first step's gradient forward pass runs
        on exactly those weights, so its detached log-probs *are* the proximal log-probs; only the samples
        of later steps need a separate no-grad pass, made before the first step changes the weights.

        `version` is the version of these weights. Samples generated with that same version were sampled
        from exactly these weights, so their behaviour log-probs must equal the proximal ones; the largest
        difference per producer (`logp_diff/<model>/<producer>`) shows an engine serving wrong weights.

        `should_stop`, asked between forward passes until the first optimizer step, abandons the update there
        (`UpdateStopped`, nothing changed): a process told to stop does not spend a whole update (tens of
        seconds for a real model on CPU) before it saves. After the first optimizer step the weights have
        changed and the update is finished, so what is saved is always a whole version. One process only:
        ranks of a sharded model would leave each other inside a collective.

        `before_step` is called once, right before the first optimizer step changes the weights: a push of
        these weights still in flight on another thread is waited for there (`drmas.learner.push`).
        """
        if not samples:
            return {}
        if should_stop is not None and self.ranks.size > 1:
            should_stop = None
        chunks = np.array_split(np.arange(len(samples)), min(self.alg.optim_steps_per_update, len(samples)))
        proximal: list[torch.Tensor | None] = [None] * len(samples)
        lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
        if len(chunks) > 1:
            if should_stop is not None and should_stop():
                raise UpdateStopped(_STOPPED)
            later = self.ranks.share(np.concatenate(chunks[1:]), lengths)
            idle = self.ranks.missing_passes(self._passes(len(later)))
            for i, lp in zip(later, self.logprobs([samples[i] for i in later])):
                proximal[i] = lp
            self.ranks.idle_passes(self.model, idle, backward=False)
        behaviour = float_rows([s.behaviour_logprobs for s in samples], self.device)
        weights = np.array([self.agent_loss_weights.get(s.agent, 1.0) for s in samples], dtype=np.float64)
        adv = np.asarray(advantages, dtype=np.float64) * weights
        sums: dict[str, list[float]] = defaultdict(list)
        first_change = _once(before_step)
        for index, chunk in enumerate(chunks):
            self._optimizer_step(chunk, samples, lengths, proximal, behaviour, adv, sums, first_change,
                                 should_stop if index == 0 else None)
        proximal = self.ranks.fill_rows(proximal, [len(s.response_ids) for s in samples])
        m = self.model_id
        on_policy = {} if version is None else on_policy_logp_diff(samples, proximal, behaviour, version)
        return {
            **{f"logp_diff/{m}/{producer}": diff for producer, diff in on_policy.items()},
            f"loss/{m}": float(np.mean(sums["loss"])),
            f"grad_norm/{m}": float(np.mean(sums["grad_norm"])),
            f"grad_norm/{m}/max": float(np.max(sums["grad_norm"])),
            f"mismatch_kl/{m}": _k3(proximal, behaviour),  # type: ignore[arg-type]
            f"ess/{m}": _ess_share(proximal, behaviour),  # type: ignore[arg-type]
            f"clip_fraction/{m}": float(np.mean(sums["clip_fraction"])),
            f"is_ratio/{m}/mean": float(np.mean(sums["is_weight_mean"])),
            f"is_ratio/{m}/max": float(np.max(sums["is_weight_max"])),
            f"skipped_steps/{m}": float(self.skipped_steps),
            f"lr/{m}": self.optimizer.param_groups[0]["lr"],
            f"tokens/{m}": float(sum(len(s.response_ids) for s in samples)),
        }

    def _optimizer_step(self, step: np.ndarray, samples, lengths, proximal, behaviour, adv, sums,
                        before_step: Callable[[], None], should_stop: Callable[[], bool] | None = None) -> None:
        """One optimizer step over samples[step], accumulating micro-batch gradients; fills in missing
        proximal log-probs from the (pre-step) gradient pass. This rank's share is `chunk`; the normaliser
        is the whole step's, so the gradients summed over ranks are the whole step's gradient. `should_stop`
        is asked before every micro-batch (see `update`)."""
        self.optimizer.zero_grad(set_to_none=True)
        chunk = self.ranks.share(step, lengths)
        part = [samples[i] for i in chunk]
        total_tokens = max(sum(len(samples[i].response_ids) for i in step), 1)
        idle = self.ranks.missing_passes(self._passes(len(part)))
        loss_total, stats_acc = 0.0, defaultdict(list)
        for local, micro in self._micro_batches(part):
            if should_stop is not None and should_stop():
                self.optimizer.zero_grad(set_to_none=True)  # gradients of the passes made so far
                raise UpdateStopped(_STOPPED)
            idx = [int(chunk[j]) for j in local]
            with self._autocast():
                logps = response_logprobs(self.model, micro)
            for i, lp in zip(idx, logps):
                if proximal[i] is None:
                    proximal[i] = lp.detach()
            mask = _pad([torch.ones(len(s.response_ids), device=self.device) for s in micro])
            adv_tok = _pad([torch.full((len(samples[i].response_ids),), float(adv[i]), device=self.device) for i in idx])
            out = policy_loss(LossInputs(_pad(logps), _pad([proximal[i] for i in idx]),
                                         _pad([behaviour[i] for i in idx]), adv_tok, mask), self.alg)
            # the loss is a mean over this micro-batch's tokens or sequences: weigh it by its share of the step's
            scale = mask.sum().item() / total_tokens if out.per == "token" else len(idx) / len(step)
            (out.loss * scale).backward()
            loss_total += out.loss.item() * scale
            for k, v in out.stats.items():
                stats_acc[k].append(v)
        self.ranks.idle_passes(self.model, idle, backward=True)
        clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        grad_norm = self.ranks.clip_grad_norm(self.params, clip)
        if math.isfinite(grad_norm):
            for group in self.optimizer.param_groups:
                group["lr"] = self.learning_rate(self.optimizer_steps + 1)
            before_step()
            self.optimizer.step()
            self.optimizer_steps += 1
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, n_micro, clip_sum, is_sum = self.ranks.sum([
            loss_total, len(stats_acc["clip_fraction"]), sum(stats_acc["clip_fraction"]),
            sum(stats_acc["is_weight_mean"])])
        (is_max,) = self.ranks.max([max(stats_acc["is_weight_max"], default=-math.inf)])
        sums["loss"].append(loss_total)
        sums["grad_norm"].append(grad_norm)
        sums["clip_fraction"].append(clip_sum / n_micro if n_micro else 0.0)
        sums["is_weight_mean"].append(is_sum / n_micro if n_micro else 1.0)
        sums["is_weight_max"].append(is_max if n_micro else 1.0)

    def _passes(self, n_samples: int) -> int:
        """Micro-batches (forward passes) `_micro_batches` makes of `n_samples` samples."""
        return -(-n_samples // self.alg.micro_batch_size)

    def _micro_batches(self, samples: Sequence[Sample]):
        """(indices, samples) micro-batches of similar lengths (little padding)."""
        order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
        size = self.alg.micro_batch_size
        for start in range(0, len(order), size):
            part = order[start : start + size]
            yield part, [samples[i] for i in part]

    def state_dict(self) -> dict:
        """Weights, AdamW state and step counters as `torch.distributed.checkpoint` saves and loads them:
        keyed by parameter name (not by the optimizer's parameter index), each rank holding only its shards
        (DTensors) when sharded, so that a checkpoint of N ranks loads into M (see `drmas.models.checkpoint`).
        DCP loads in place into these tensors; `load_state_dict` then hands them to the model and optimizer."""
        if self.adapter is not None:  # only this adapter: the base is frozen, other adapters have trainers of their own
            adapters.use_adapter(self.model, self.adapter)
        model, optimizer = get_state_dict(self.model, self.optimizer)
        if self.adapter is not None:
            model = {name: tensor for name, tensor in model.items() if name in self._own}
        return {"model": model, "optimizer": optimizer, "skipped_steps": self.skipped_steps,
                "optimizer_steps": self.optimizer_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.adapter is not None:
            adapters.use_adapter(self.model, self.adapter)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=StateDictOptions(strict=self.adapter is None))
        self.skipped_steps = int(state["skipped_steps"])
        self.optimizer_steps = int(state["optimizer_steps"])


def _once(call: Callable[[], None] | None) -> Callable[[], None]:
    """`call` on the first call of the result only (none: nothing)."""
    pending = [call] if call is not None else []

    def first() -> None:
        while pending:
            pending.pop()()

    return first


def checkpoint_layers(model: torch.nn.Module, key: str) -> None:
    """Have every decoder layer of this Hugging Face model recompute its activations in the backward pass.

    Why: a training forward keeps every layer's intermediate tensors for the backward, about 45 KB per
    token per layer for SmolLM2-135M in float32 (4 GB for one micro-batch of 8 x 280 tokens, twice the
    weights, gradients and AdamW moments together). Checkpointed, only each layer's input is kept and one
    layer's activations are alive at a time during the backward, for about one more forward pass of
    compute. The recomputation repeats the same operations on the same inputs, so losses and gradients
    are those of the plain pass. Non-reentrant checkpointing (PyTorch's recommended kind) also works
    inside FSDP2-sharded layers and under autocast."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{key}: {type(model).__name__} does not support activation checkpointing; set it to false")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _pad(rows: list[torch.Tensor]) -> torch.Tensor:
    return pad_sequence([r.float() if not r.is_floating_point() else r for r in rows], batch_first=True)


def producer_of(group_id: str) -> str:
    """The rollout process a group came from: group ids are `<producer>-<incarnation>-g<n>`."""
    head = group_id.rsplit("-g", 1)[0]
    return head.rsplit("-", 1)[0] if "-" in head else head


def on_policy_logp_diff(
    samples: Sequence[Sample], learner: list[torch.Tensor], behaviour: list[torch.Tensor], version: int
) -> dict[str, float]:
    """Largest |log pi_learner - log pi_behaviour| per producer over the samples made with `version`."""
    out: dict[str, float] = {}
    for s, lp, bp in zip(samples, learner, behaviour):
        if s.policy_version != version or lp.numel() == 0:
            continue
        producer = producer_of(s.group_id)
        out[producer] = max(out.get(producer, 0.0), float((lp.float() - bp).abs().max()))
    return out


def _k3(learner: list[torch.Tensor], behaviour: list[torch.Tensor]) -> float:
    """KL(behaviour || learner) estimated on the behaviour's own tokens with the low-variance k3 estimator."""
    if not learner:
        return 0.0
    log_ratio = torch.cat(learner) - torch.cat(behaviour)
    if log_ratio.numel() == 0:
        return 0.0
    log_ratio = log_ratio.clamp(-20, 20)
    return float((log_ratio.exp() - 1 - log_ratio).mean())


def _ess_share(proximal: list[torch.Tensor], behaviour: list[torch.Tensor]) -> float:
    """Effective sample size share of the behaviour importance weights w = pi_prox / pi_behaviour over all
    tokens, (sum w)^2 / (n sum w^2): 1 when the data is on-policy, towards 1/n as a few tokens dominate.
    Stale or mismatched samples lower it before they show up as a clipped loss."""
    if not proximal:
        return 1.0
    log_w = (torch.cat(proximal) - torch.cat(behaviour)).double()
    if log_w.numel() == 0:
        return 1.0
    log_w = log_w - log_w.max()  # the ratio is scale-free: shift for overflow-free exponentials
    w = log_w.exp()
    return float(w.sum() ** 2 / (w.numel() * (w**2).sum()))
