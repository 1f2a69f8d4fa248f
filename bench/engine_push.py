"""Benchmark: a weight push into a running vLLM engine vs into the embedded engine, same model, same bytes.

    .venv/bin/python bench/engine_push.py [--model smollm2|tiny] [--reps 3]

Each engine runs in a process of its own behind a `WeightReceiver`, as in a rollout; this process is the
learner and pushes the model's weights (perturbed each time) with `WeightSender.push`. The push time is
Manifest to Ack: the transfer over the gloo pair plus the engine's `load_weights` (for vLLM: its
`reload_weights` into the fused, repacked layout, the tied-head repack and the prefix-cache reset). The
receivers also report how long their apply callback ran (the generation pause). Pushes to the two engines
alternate after one warm-up each; medians are reported, and the ratio is vLLM / embedded in GB/s.
After the timed pushes each engine's log-probs of one greedy response are checked against the learner's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.config.schema import TinyModelConfig  # noqa: E402
from drmas.config.weights import WeightSyncConfig  # noqa: E402
from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.logprobs import sequence_logprobs  # noqa: E402
from drmas.models.loading import build_tiny_model, import_smollm2, load_model  # noqa: E402
from drmas.weights import WeightReceiver, WeightSender  # noqa: E402

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def _engine_process(kind: str, path: str, endpoint: str, pauses: mp.Queue, checks: mp.Queue) -> None:
    """Host an engine behind a WeightReceiver; after each apply report its duration; on request, a greedy
    response with its log-probs."""
    if kind == "vllm":
        from drmas.engines.vllm_engine import VLLMEngine

        engine = VLLMEngine(kind, path, engine_args={"kv_cache_memory_bytes": 512 << 20})
    else:
        from drmas.engines.embedded import EmbeddedEngine

        engine = EmbeddedEngine.from_path(kind, path)

    def load(named, version: int, incarnation: str = "") -> None:
        start = time.perf_counter()
        engine.load_weights(named, version, incarnation)
        pauses.put((kind, version, time.perf_counter() - start))

    receiver = WeightReceiver(endpoint, kind, load, config=WeightSyncConfig(timeout_s=300, ready_timeout_s=300))
    receiver.start()
    while True:
        receiver.poll()
        if not checks.empty():
            checks.get()
            (generation,) = engine.generate([PROMPT], [SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)])
            pauses.put((kind, "check", (generation.token_ids, generation.logprobs)))
        time.sleep(0.01)


def _expect(queue: mp.Queue, kind: str, tag) -> object:
    """The next report of `kind` tagged `tag` (a version, or "check"); earlier reports (join syncs) are skipped."""
    while True:
        got_kind, got_tag, value = queue.get(timeout=300)
        if (got_kind, got_tag) == (kind, tag):
            return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    path = import_smollm2() if args.model == "smollm2" else build_tiny_model(TinyModelConfig())
    model, _ = load_model(path)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ctx = mp.get_context("spawn")
    pauses: mp.Queue = ctx.Queue()
    config = WeightSyncConfig(chunk_mb=32, timeout_s=300, ready_timeout_s=300, backend="gloo")
    senders, children, checks = {}, [], {}
    try:
        for kind in ("embedded", "vllm"):
            senders[kind] = WeightSender("127.0.0.1", config=config, model=kind,
                                         current_weights=lambda: (0, list(model.named_parameters()))).start()
            checks[kind] = ctx.Queue()
            child = ctx.Process(target=_engine_process, args=(kind, str(path), senders[kind].endpoint, pauses,
                                                              checks[kind]), daemon=True)
            child.start()
            children.append(child)
        for kind, sender in senders.items():
            deadline = time.monotonic() + 300
            while not sender.receivers():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {kind} engine did not join")
                time.sleep(0.1)
        times: dict[str, list[float]] = {kind: [] for kind in senders}
        applies: dict[str, list[float]] = {kind: [] for kind in senders}
        for version in range(1, args.reps + 2):
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(1.0 + 1e-3)
            for kind, sender in senders.items():
                report = sender.push(list(model.named_parameters()), version)
                if report.receivers_ok != [kind]:
                    raise RuntimeError(f"push to {kind} failed: {report}")
                apply_s = _expect(pauses, kind, version)
                if version > 1:  # the first push of each is a warm-up
                    times[kind].append(report.seconds)
                    applies[kind].append(apply_s)
        with torch.no_grad():
            learner_lp = {}
            for kind in senders:
                checks[kind].put(True)
                tokens, logprobs = _expect(pauses, kind, "check")
                recomputed = sequence_logprobs(model, [PROMPT], [tokens], [1.0])[0]
                learner_lp[kind] = float((recomputed - torch.tensor(logprobs)).abs().max())
    finally:
        for child in children:
            child.kill()
        for sender in senders.values():
            sender.close()
    print(f"model={args.model} {nbytes / 1e6:.1f} MB fp32, {args.reps} timed pushes each")
    rate = {}
    for kind in senders:
        push, apply_s = statistics.median(times[kind]), statistics.median(applies[kind])
        rate[kind] = nbytes / push / 1e9
        print(f"{kind:9s} push {push:6.3f} s ({rate[kind]:5.2f} GB/s), apply (generation paused) {apply_s:6.3f} s, "
              f"max |learner - engine| log-prob after the pushes {learner_lp[kind]:.1e}")
    print(f"vllm / embedded = {rate['vllm'] / rate['embedded']:.2f}x")


if __name__ == "__main__":
    main()
