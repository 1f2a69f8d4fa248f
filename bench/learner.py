"""Benchmark: tokens/s of one learner update from pulled groups against a bare PyTorch loop on the same batch.

Run on demand (not part of the tests):

    .venv/bin/python bench/learner.py [--model tiny|smollm2|both] [--groups 4] [--group-size 4]
                                      [--prompt 192] [--response 64] [--reps 3]

learner: the frames of one `GroupBatch` as the buffer sends them -> `decode_client_reply` + `open_group` (packed
  arrays to numpy views) -> `group_advantages` -> `PolicyTrainer.update` (collation, log-prob recompute,
  decoupled-PPO loss, backward, grad clip, AdamW step, metrics).
bare: the same micro-batches, pre-collated into tensors outside the timed part -> forward with the same
  `logits_to_keep`, log-softmax, gather, a policy-gradient loss, backward, grad clip, AdamW step.

Both sides train a copy of the same weights with the same micro-batch size and one optimizer step per update,
so they do the same forward/backward/step; what the learner spends beyond that is its overhead (decoding,
collation, the PPO loss terms, metrics). Each side gets one warm-up update, then the repetitions alternate;
the median is reported as `learner/bare = X.XXx`, with the learner's time split into its phases.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.buffer.framing import (  # noqa: E402
    AgentGroupView,
    GroupBatchView,
    decode_client_reply,
    encode_frames,
    open_group,
)
from drmas.config.schema import AlgorithmConfig, OptimConfig, TinyModelConfig  # noqa: E402
from drmas.core.sample import Sample, encode_sample  # noqa: E402
from drmas.learner.batch import group_advantages  # noqa: E402
from drmas.learner.collate import left_padded, response_logprobs  # noqa: E402
from drmas.learner.policy import PolicyTrainer  # noqa: E402
from drmas.algorithms.running_stats import AgentRewardStats  # noqa: E402
from drmas.models.loading import build_tiny_model, import_smollm2, load_model  # noqa: E402


def make_batch_frames(model, args, seed: int = 0) -> list[bytes]:
    """One pull's reply (its frames): `groups` GRPO groups of one agent, behaviour log-probs from the model itself (so the
    importance ratios are near 1, as on-policy data would have them)."""
    rng = np.random.default_rng(seed)
    vocab = model.get_input_embeddings().num_embeddings
    groups = []
    for g in range(args.groups):
        samples = []
        for e in range(args.group_size):
            prompt = rng.integers(0, vocab, int(args.prompt * rng.uniform(0.75, 1.0)))
            response = rng.integers(0, vocab, int(args.response * rng.uniform(0.5, 1.0)))
            samples.append(Sample(episode_id=f"g{g}/e{e}", group_id=f"g{g}", agent="solver", model="m", turn=0,
                                  prompt_ids=prompt, response_ids=response, behaviour_logprobs=np.zeros(len(response)),
                                  policy_version=0, temperature=1.0, valid=True, reward=float(rng.random())))
        with torch.no_grad():
            for sample, logp in zip(samples, response_logprobs(model, samples)):
                sample.behaviour_logprobs = logp.numpy()
        groups.append(AgentGroupView(group_id=f"g{g}", agent="solver", model="m",
                                     samples=[encode_sample(s) for s in samples],
                                     episode_scores={s.episode_id: s.reward for s in samples},
                                     group_rewards=[s.reward for s in samples]))
    return encode_frames(GroupBatchView(seq=1, groups=groups))


class LearnerSide:
    """The learner's path from the reply frames to the optimizer step, timed by phase."""

    def __init__(self, model, alg: AlgorithmConfig) -> None:
        self.trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-6), alg)
        self.alg = alg
        self.stats = AgentRewardStats()

    def step(self, data: list[bytes]) -> dict[str, float]:
        t0 = time.perf_counter()
        groups = [open_group(view) for view in decode_client_reply(data).groups]
        t1 = time.perf_counter()
        samples, adv = group_advantages(groups, self.alg, self.stats)
        t2 = time.perf_counter()
        self.trainer.update(samples, adv)
        t3 = time.perf_counter()
        return {"decode": t1 - t0, "advantages": t2 - t1, "update": t3 - t2, "total": t3 - t0}


class BareSide:
    """A plain loop over pre-collated micro-batches: forward, log-softmax, gather, loss, backward, step."""

    def __init__(self, model, samples: list[Sample], micro_batch: int) -> None:
        self.model = model
        self.model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))  # as the learner batches
        self.micro = []
        for start in range(0, len(order), micro_batch):
            part = order[start : start + micro_batch]
            ids, mask, positions = left_padded(part)
            longest = max(len(s.response_ids) for s in part)
            self.micro.append((ids, mask, positions, longest, ids[:, -longest:]))

    def step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        for ids, mask, positions, longest, targets in self.micro:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                             logits_to_keep=longest + 1)
            logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1).gather(-1, targets.unsqueeze(-1))
            (-logp.mean()).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), OptimConfig().grad_clip)
        self.optimizer.step()
        return {"total": time.perf_counter() - t0}


def bench_model(name: str, args) -> None:
    model_dir = import_smollm2() if name == "smollm2" else build_tiny_model(TinyModelConfig())
    model, _ = load_model(model_dir)
    torch.manual_seed(0)
    data = make_batch_frames(model, args)
    samples = [s for view in decode_client_reply(data).groups for s in open_group(view).samples]
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    alg = AlgorithmConfig(micro_batch_size=args.micro_batch, optim_steps_per_update=1)
    learner = LearnerSide(copy.deepcopy(model), alg)
    bare = BareSide(copy.deepcopy(model), samples, args.micro_batch)
    learner.step(data), bare.step()  # warm-up
    runs: dict[str, list[dict[str, float]]] = {"learner": [], "bare": []}
    for _ in range(args.reps):
        runs["learner"].append(learner.step(data))
        runs["bare"].append(bare.step())
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    rate = {side: tokens / med[side]["total"] for side in med}
    phases = ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in med["learner"].items() if k != "total")
    print(f"[{name}: {len(samples)} samples, {tokens} tokens an update, micro-batch {args.micro_batch}, "
          f"median of {args.reps}]")
    print(f"learner update: {rate['learner']:10.0f} tokens/s ({phases})")
    print(f"bare loop:      {rate['bare']:10.0f} tokens/s ({1000 * med['bare']['total']:.1f} ms)")
    print(f"learner/bare = {rate['learner'] / rate['bare']:.2f}x  ({name})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2", "both"], default="both")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups in the pull")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=192, help="longest prompt (tokens); rows take 75-100%%")
    parser.add_argument("--response", type=int, default=64, help="longest response (tokens); rows take 50-100%%")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    for name in (["tiny", "smollm2"] if args.model == "both" else [args.model]):
        bench_model(name, args)


if __name__ == "__main__":
    main()
