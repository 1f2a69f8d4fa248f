"""The figures a GPU run of drmas is judged by, on one device, with a tiny model built on the spot.

    python bench/gpu_figures.py [--device cuda] [--hidden 1024 --layers 12 --heads 16 --intermediate 4096]
                                [--batches 64,256] [--new-tokens 128] [--reps 3]

The defaults make the 252M-parameter Qwen2 of issue 24 (SmolLM2 vocabulary, random weights: the figures are
about arithmetic and bytes, not about what the model says). Each figure is one line `FIGURE name value unit
(details)`, and they are:

- `build_s`: building that model primed with `--prime-steps` steps, on the device (`build_tiny_model`);
- `gap_float32`, `gap_bfloat16`: the on-policy gap, max |learner - engine| log-prob per token, on the
  engine's own samples, with both sides in that compute dtype (the precision contract, `drmas.models.devices`);
- `engine_tok_s` / `generate_tok_s` per batch: the embedded engine against transformers `generate()` on the
  same left-padded batch, `--new-tokens` tokens per row (EOS off, sampling on), medians of interleaved runs;
  also in bfloat16 (`_bf16`);
- `push_gb_s_float32`, `push_gb_s_bfloat16`: a weight push (Manifest to Ack) from the device's parameters
  over gloo into an engine on the device in another process (a rollout), median of `--reps`;
- `learner_step_s_float32`, `learner_step_s_bfloat16`: one `PolicyTrainer.update` of the first batch's
  samples (64 by default), median of `--reps`.

On a machine without a GPU, `--device cpu` with a small shape runs every part (that is how it is tested).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import hf_generate_fn, make_prompts  # noqa: E402

from drmas.config.schema import AlgorithmConfig, OptimConfig, TinyModelConfig  # noqa: E402
from drmas.config.weights import WeightSyncConfig  # noqa: E402
from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.embedded import EmbeddedEngine  # noqa: E402
from drmas.learner.policy import PolicyTrainer  # noqa: E402
from drmas.models.loading import build_tiny_model, load_model  # noqa: E402
from drmas.core.sample import Sample  # noqa: E402


def figure(name: str, value: float, unit: str, details: str = "") -> None:
    print(f"FIGURE {name} {value:.4g} {unit}" + (f" ({details})" if details else ""), flush=True)


def synced(device: torch.device, fn):
    """`fn` timed to the end of its device work."""
    def run():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out
    return run


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(args, device: torch.device) -> Path:
    """The random model of the given shape (cached), and `build_s`: a primed build of it in a fresh cache."""
    import os

    shape = dict(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                 intermediate_size=args.intermediate, seed=0)
    path = build_tiny_model(TinyModelConfig(**shape))
    if args.prime_steps:
        cache = os.environ.get("DRMAS_CACHE")
        with tempfile.TemporaryDirectory() as tmp:
            from drmas.models.loading import smollm2_tokenizer_dir

            tokenizer = smollm2_tokenizer_dir()
            (Path(tmp) / "tokenizers").mkdir()
            (Path(tmp) / "tokenizers" / tokenizer.name).symlink_to(tokenizer)
            os.environ["DRMAS_CACHE"] = tmp
            try:
                start = time.perf_counter()
                build_tiny_model(TinyModelConfig(**shape, prime_steps=args.prime_steps), device=device)
                figure("build_s", time.perf_counter() - start, "s", f"prime_steps={args.prime_steps} on {device}")
            finally:
                os.environ["DRMAS_CACHE"] = cache or ""
                if cache is None:
                    del os.environ["DRMAS_CACHE"]
    return path


def samples_of(engine: EmbeddedEngine, prompts, new_tokens: int) -> list[Sample]:
    gens = engine.generate(prompts, [SamplingParams(max_new_tokens=new_tokens, seed=i) for i in range(len(prompts))])
    return [Sample(episode_id=f"e{i}", group_id="r-x-g0", agent="a", model="m", turn=0, prompt_ids=p,
                   response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=0, temperature=1.0,
                   valid=True, reward=float(i % 2)) for i, (p, g) in enumerate(zip(prompts, gens))]


def precision_and_learner(path: Path, device: torch.device, prompts, args) -> None:
    """gap_* and learner_step_s_* in both compute dtypes."""
    for compute in ("float32", "bfloat16"):
        model, tokenizer = load_model(path, dtype=compute, device=device)
        engine = EmbeddedEngine("m", model, tokenizer, max_batch_size=len(prompts), seed=0)
        samples = samples_of(engine, prompts, args.new_tokens)
        engine = model = None
        learner, _ = load_model(path, device=device)
        trainer = PolicyTrainer("m", learner, OptimConfig(lr=1e-6), AlgorithmConfig(micro_batch_size=args.micro_batch),
                                compute_dtype=getattr(torch, compute))
        gap = max(float((lp.cpu() - torch.as_tensor(s.behaviour_logprobs)).abs().max())
                  for lp, s in zip(trainer.logprobs(samples), samples))
        figure(f"gap_{compute}", gap, "nats", f"max |learner - engine| per token, {len(samples)} samples")
        advantages = np.array([1.0, -1.0] * (len(samples) // 2) + [0.0] * (len(samples) % 2))
        seconds = median_seconds(synced(device, lambda: trainer.update(samples, advantages)), args.reps)
        tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        figure(f"learner_step_s_{compute}", seconds, "s", f"{len(samples)} samples, {tokens} tokens, micro-batch "
               f"{args.micro_batch}")
        trainer = learner = None  # free the device memory before the next dtype
        if device.type == "cuda":
            torch.cuda.empty_cache()


def generation(path: Path, device: torch.device, args) -> None:
    """engine_tok_s / generate_tok_s per batch, float32 and bfloat16."""
    ns = argparse.Namespace(temperature=1.0, top_p=1.0, new_tokens=args.new_tokens)
    for dtype in ("float32", "bfloat16"):
        model, tokenizer = load_model(path, dtype=dtype, device=device)
        suffix = "" if dtype == "float32" else "_bf16"
        for batch in args.batches:
            prompts = make_prompts(tokenizer, batch)
            engine = EmbeddedEngine("m", model, tokenizer, max_batch_size=batch, eos_token_ids=())
            params = [SamplingParams(max_new_tokens=args.new_tokens)] * batch
            runs = {"engine": synced(device, lambda: engine.generate(prompts, params)),
                    "generate": synced(device, hf_generate_fn(model, tokenizer, prompts, ns, device))}
            for fn in runs.values():
                fn()
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.reps):
                for name, fn in runs.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            rates = {name: batch * args.new_tokens / statistics.median(t) for name, t in times.items()}
            for name, rate in rates.items():
                figure(f"{name}_tok_s{suffix}_b{batch}", rate, "tok/s", f"batch {batch}, {args.new_tokens} tokens")
            figure(f"engine_vs_generate{suffix}_b{batch}", rates["engine"] / rates["generate"], "x")
        model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _rollout(path: str, device: str, dtype: str, endpoint: str, done: mp.Queue, stop: mp.Queue) -> None:
    """A rollout: an engine on the device behind a WeightReceiver; reports every applied version."""
    from drmas.weights import WeightReceiver

    model, tokenizer = load_model(path, dtype=dtype, device=torch.device(device))
    engine = EmbeddedEngine("m", model, tokenizer)

    def apply(named, version: int, incarnation: str = "") -> None:
        engine.load_weights(named, version, incarnation)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        done.put(version)

    with WeightReceiver(endpoint, "r0", apply, background=True, config=WeightSyncConfig(join_retry_s=0.1)):
        stop.get()


def pushes(path: Path, device: torch.device, args) -> None:
    """push_gb_s_* : the device's parameters pushed into an engine on the device in another process."""
    from drmas.weights import WeightSender

    learner, _ = load_model(path, device=device)
    named = [(n, p.detach()) for n, p in learner.named_parameters()]
    context = mp.get_context("spawn")
    for dtype in ("float32", "bfloat16"):
        applied, stop = context.Queue(), context.Queue()
        with WeightSender("127.0.0.1", config=WeightSyncConfig(timeout_s=120.0, backend="gloo"), device=device,
                          dtype=getattr(torch, dtype)) as sender:
            child = context.Process(target=_rollout, args=(str(path), str(device), dtype, sender.endpoint, applied, stop))
            child.start()
            try:
                deadline = time.monotonic() + 300  # a fresh process: imports, the model, CUDA context
                while "r0" not in sender.receivers():
                    if time.monotonic() > deadline or not child.is_alive():
                        raise RuntimeError("the rollout process did not join")
                    time.sleep(0.1)
                seconds, size = [], 0
                for version in range(1, args.reps + 2):
                    report = sender.push(named, version)
                    if report.receivers_ok != ["r0"]:
                        raise RuntimeError(f"push {version} failed: {report}")
                    if applied.get(timeout=120) != version:
                        raise RuntimeError("the rollout applied another version")
                    if version > 1:  # the first one includes joining and first allocations
                        seconds.append(report.seconds)
                    size = report.bytes
                median = statistics.median(seconds)
                figure(f"push_gb_s_{dtype}", size / median / 1e9, "GB/s",
                       f"{size / 1e6:.0f} MB in {median:.3f} s, gloo, from {device} into an engine on {device}")
            finally:
                stop.put(None)
                child.join(60)
                if child.is_alive():
                    child.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--batches", default="64,256", help="engine batches (the first is also the learner's)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prime-steps", type=int, default=100, help="0: no priming build figure")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default="build,precision,generation,push", help="which parts to run")
    parser.add_argument("--model-dir", default=None, help="an HF model directory instead of the random tiny model "
                        "(e.g. SmolLM2's, for the gap of trained weights); no build figure then")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    device = torch.device(args.device)
    parts = set(args.only.split(","))
    if args.model_dir:
        path = Path(args.model_dir)
    elif "build" in parts:
        path = build(args, device)
    else:
        path = build_tiny_model(TinyModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                                intermediate_size=args.intermediate))
    params = sum(p.numel() for p in load_model(path)[0].parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model: {params / 1e6:.0f}M parameters ({args.model_dir or f'hidden {args.hidden}, {args.layers} layers'}) "
          f"on {device} ({name}), torch {torch.__version__}", flush=True)
    if "precision" in parts:
        _, tokenizer = load_model(path)
        precision_and_learner(path, device, make_prompts(tokenizer, args.batches[0]), args)
    if "generation" in parts:
        generation(path, device, args)
    if "push" in parts:
        pushes(path, device, args)


if __name__ == "__main__":
    main()
