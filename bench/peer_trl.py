"""TRL's side of bench/peer.py: `GRPOTrainer` told what a drmas config says, as far as TRL can be told.

What is set from the drmas config (configs/peer.yaml) and how, side by side:

| drmas                                         | TRL GRPOConfig / trainer                                   |
|-----------------------------------------------|------------------------------------------------------------|
| models.<m> (its directory, float32)           | the same directory, model_init_kwargs dtype float32, CPU   |
| the solver's first turn of each problem       | the same chat messages as a conversational `prompt`        |
| drawing order for trainer.seed (draws 0..N-1) | the dataset in that order, shuffle_dataset false           |
| rollout.group_size x prompts_per_step         | num_generations; micro-batches of micro_batch_size         |
| temperature, top_p, agent max_new_tokens      | temperature, top_p, top_k 0, max_completion_length         |
| optim lr, betas, eps, weight_decay, grad_clip | learning_rate, adam_*, weight_decay, max_grad_norm         |
| no schedule (warmup_steps 0)                  | lr_scheduler_type constant                                  |
| estimator global (std ddof=1, eps 1e-6)       | scale_rewards group (torch.std, unbiased; eps 1e-4)        |
| clip_low / clip_high, one update per batch    | epsilon / epsilon_high, num_iterations 1, beta 0 (no KL)   |
| aggregation token-mean (the step's tokens)    | loss_type dapo (the accumulated batch's tokens)            |
| the task's grade of the reply                 | a reward function calling the same grade                   |
| trainer.threads                               | torch.set_num_threads                                      |

What cannot be made equal is listed in docs/benchmarks.md ("Parity with TRL"). The prompt's token ids are
checked to be drmas's own before training (`prompt_ids_match` in the result).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path


def first_turn_messages(orchestra, problem) -> list[dict]:
    """The messages of the episode's first model call, as the drmas orchestra builds them."""
    episode = orchestra.run(problem)
    turn = next(episode)
    episode.close()
    return [dict(m) for m in turn.messages]


def trl_trainer(config: str, seed: int, steps: int, overrides: list[str], out: str, callbacks=()):
    """TRL's GRPOTrainer set up as `config` describes (the table above), on the problems drmas draws for `seed`;
    returns (trainer, the drmas config, the problems in order, whether the prompt token ids are drmas's own)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from drmas import assembly
    from drmas.core.tool_calls import prompt_ids

    cfg = assembly.load_config(config, [*overrides, f"trainer.seed={seed}", f"trainer.steps={steps}"])
    torch.set_num_threads(cfg.trainer.threads)
    solver = next(name for name, a in cfg.agents.items() if a.role == "solver")
    agent, alg, roll = cfg.agents[solver], cfg.algorithm, cfg.rollout
    optim = cfg.models[agent.model].optim
    path = assembly.model_path(cfg, agent.model)
    task = assembly.build_task(cfg)
    order = assembly.drawing_order(cfg, task)
    orchestra = assembly.build_orchestra(cfg, task)
    problems = [order.at(d) for d in range(steps * roll.prompts_per_step)]
    by_uid = {p.uid: p for p in problems}
    rows = [{"prompt": first_turn_messages(orchestra, p), "uid": p.uid} for p in problems]
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    templated = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    match = all(tokenizer(t, add_special_tokens=False)["input_ids"] == list(prompt_ids(tokenizer, r["prompt"], None))
                for t, r in zip(templated, rows))

    def reward(completions, uid, **_) -> list[float]:
        return [float(task.grade(by_uid[u], c[-1]["content"])) for c, u in zip(completions, uid)]

    group = roll.group_size * roll.prompts_per_step
    size = alg.micro_batch_size if group % alg.micro_batch_size == 0 else 1  # drmas's micro-batches, where they divide
    micro = group // size
    args = GRPOConfig(
        output_dir=out, use_cpu=True, bf16=False, fp16=False, seed=seed, data_seed=seed, max_steps=steps,
        per_device_train_batch_size=size, gradient_accumulation_steps=micro, steps_per_generation=micro,
        num_generations=roll.group_size, max_completion_length=agent.max_new_tokens or roll.max_new_tokens,
        temperature=roll.temperature, top_p=roll.top_p, top_k=0, shuffle_dataset=False,
        learning_rate=optim.lr, adam_beta1=optim.beta1, adam_beta2=optim.beta2, adam_epsilon=optim.eps,
        weight_decay=optim.weight_decay, max_grad_norm=optim.grad_clip, lr_scheduler_type="constant", warmup_steps=0,
        beta=0.0, num_iterations=1, epsilon=alg.clip_low, epsilon_high=alg.clip_high, loss_type="dapo",
        scale_rewards="group", mask_truncated_completions=False, disable_dropout=True,
        model_init_kwargs={"dtype": torch.float32}, logging_steps=1, report_to="none", save_strategy="no",
        log_completions=False, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=str(path), reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=list(callbacks))
    return trainer, cfg, problems, match


def train_trl(config: str, seed: int, steps: int, overrides: list[str], out: str) -> dict:
    """Train `steps` GRPO steps with TRL on what `config` describes; per-step reward, lengths, times, peak RSS."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_begin(self, *a, **k):
            self.start = time.monotonic()

        def on_step_end(self, *a, **k):
            self.ends.append(time.monotonic())

    clock = Clock()
    trainer, cfg, problems, match = trl_trainer(config, seed, steps, overrides, out, [clock])
    group = cfg.rollout.group_size * cfg.rollout.prompts_per_step
    trainer.train()
    logs = [r for r in trainer.state.log_history if "reward" in r]
    marks = [clock.start, *clock.ends]
    return {
        "framework": "trl", "seed": seed, "steps": len(logs), "prompt_ids_match": match,
        "reward": [float(r["reward"]) for r in logs],
        "tokens": [float(r["completions/mean_length"]) * group for r in logs],
        "samples": [group] * len(logs),
        "step_seconds": [b - a for a, b in zip(marks, marks[1:])],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prompts": [p.uid for p in problems], "out": str(Path(out)),
    }
