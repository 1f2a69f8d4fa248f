"""Benchmark: weight push (`WeightSender` -> `WeightReceiver`) against a raw chunked gloo broadcast.

Run on demand (not part of the tests):

    .venv/bin/python bench/weight_sync.py [--mb 540] [--chunk-mb 32] [--reps 3]

Why it exists: the weight channel adds a control handshake, packing of small tensors into chunks, unpacking
into named tensors and an apply callback on top of the broadcast itself; that overhead must stay small
(goal: push >= 0.8x the raw rate). Both sides move the same bytes between two processes over a two-rank gloo
group in ``--chunk-mb`` pieces:

(a) raw: the learner broadcasts slices of one flat buffer into one flat buffer of the other process, with an
    allreduce barrier before and after (so the time covers the receiver's completion);
(b) push: the same bytes as named tensors shaped like SmolLM2-135M (a 49152x576 embedding, then decoder
    layers; the default size is its fp32 weights, ~540 MB), pushed to one receiver whose apply callback
    copies every tensor into preallocated parameters, as an engine's ``load_weights`` does. The push time is
    the learner's `PushReport.seconds` (Manifest to Ack). The receiver also reports how long it spent inside
    the callback: the time its generation would be paused.
    A diagnostic line repeats (b) with an apply callback that only iterates (no copy): the channel's own cost,
    without the engine's copy that (a) does not have to do.

Raw and push runs alternate (after one warm-up run each: page faults, first connections) so that both see
the same background load; medians and best runs are reported (on a shared machine the best run is the
better estimate of what the code can do, the median of what it did).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.config.weights import WeightSyncConfig  # noqa: E402
from drmas.weights import WeightReceiver, WeightSender  # noqa: E402

HIDDEN, VOCAB, INTER, KV = 576, 49152, 1536, 192  # SmolLM2-135M


def model_like(mb: float) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a SmolLM2-135M-like fp32 model of about ``mb`` MiB (embedding first, then layers)."""
    target = int(mb * (1 << 20)) // 4
    layer = [("q_proj", (HIDDEN, HIDDEN)), ("k_proj", (KV, HIDDEN)), ("v_proj", (KV, HIDDEN)),
             ("o_proj", (HIDDEN, HIDDEN)), ("gate_proj", (INTER, HIDDEN)), ("up_proj", (INTER, HIDDEN)),
             ("down_proj", (HIDDEN, INTER)), ("input_layernorm", (HIDDEN,)), ("post_attention_layernorm", (HIDDEN,))]
    shapes: list[tuple[str, tuple[int, ...]]] = []
    embed_rows = min(VOCAB, max(1, target // HIDDEN))
    shapes.append(("model.embed_tokens.weight", (embed_rows, HIDDEN)))
    total = embed_rows * HIDDEN
    index = 0
    while total < target:
        for name, shape in layer:
            numel = 1
            for size in shape:
                numel *= size
            if total + numel > target:
                break
            shapes.append((f"model.layers.{index}.{name}.weight", shape))
            total += numel
        else:
            index += 1
            continue
        break
    return shapes


def payload_bytes(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    return sum(4 * torch.Size(shape).numel() for _, shape in shapes)


# ------------------------------------------------------------------------------------------ (a) raw


def _raw_group(store: dist.Store, rank: int) -> dist.ProcessGroup:
    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=600)  # the receiver waits in a barrier while pushes run
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore("raw/", store), rank, 2, options)


def _raw_run(group: dist.ProcessGroup, flat: torch.Tensor, chunk: int) -> float:
    """One chunked broadcast of ``flat`` (both ranks call it); barriers make the time cover both sides."""
    barrier = torch.zeros(1)
    group.allreduce([barrier]).wait()
    start = time.perf_counter()
    for offset in range(0, flat.numel(), chunk):
        options = dist.BroadcastOptions()
        options.rootRank = 0
        group.broadcast([flat[offset : offset + chunk]], options).wait()
    group.allreduce([barrier]).wait()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------ the other process


def _receiver_process(store_port: int, endpoint: str, mb: float, chunk: int, runs: int, pauses: mp.Queue) -> None:
    """Serves both measurements: a raw-broadcast thread and a WeightReceiver applying into 'parameters'."""
    store = dist.TCPStore("127.0.0.1", store_port, None, False, datetime.timedelta(seconds=60))
    group = _raw_group(store, 1)
    shapes = model_like(mb)
    flat = torch.zeros(payload_bytes(shapes), dtype=torch.uint8)
    params = {name: torch.zeros(shape) for name, shape in shapes}  # touched pages, as a loaded engine has

    def load_weights(named, version: int, incarnation: str = "") -> None:
        start = time.perf_counter()
        if version % 2 == 0:  # as an engine does
            for name, tensor in named:
                params[name].copy_(tensor)
        else:  # diagnostic: the channel alone, tensors consumed without a copy
            for name, tensor in named:
                pass
        pauses.put((version, time.perf_counter() - start))

    WeightReceiver(endpoint, "bench", load_weights, background=True).start()
    for _ in range(runs):
        _raw_run(group, flat, chunk)
    time.sleep(600)  # the parent kills us


def run(mb: float, chunk_mb: float, reps: int) -> dict[str, list[float]]:
    """Alternates raw runs, pushes and diagnostic pushes whose apply does not copy (one warm-up each), so all
    see the same background load."""
    ctx = mp.get_context("spawn")
    shapes = model_like(mb)
    weights = [(name, torch.randn(shape)) for name, shape in shapes]
    flat = torch.randint(0, 255, (payload_bytes(shapes),), dtype=torch.uint8)
    chunk = int(chunk_mb * (1 << 20))
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    config = WeightSyncConfig(chunk_mb=chunk_mb, timeout_s=120, ready_timeout_s=120, backend="gloo")
    pauses: mp.Queue = ctx.Queue()
    with WeightSender("127.0.0.1", config=config) as sender:
        child = ctx.Process(target=_receiver_process, args=(store.port, sender.endpoint, mb, chunk, reps + 1, pauses),
                            daemon=True)
        child.start()
        try:
            group = _raw_group(store, 0)
            deadline = time.monotonic() + 120
            while not sender.receivers():
                if time.monotonic() > deadline or not child.is_alive():
                    raise RuntimeError("the receiver did not connect")
                time.sleep(0.05)
            times: dict[str, list[float]] = {"raw": [], "push": [], "pause": [], "push_nocopy": []}
            for rep in range(reps + 1):
                times["raw"].append(_raw_run(group, flat, chunk))
                for version in (2 * rep, 2 * rep + 1):
                    report = sender.push(weights, version)
                    if report.receivers_ok != ["bench"]:
                        raise RuntimeError(f"push failed: {report}")
                    got_version, pause = pauses.get(timeout=120)
                    assert got_version == version
                    if version % 2 == 0:
                        times["push"].append(report.seconds)
                        times["pause"].append(pause)
                    else:
                        times["push_nocopy"].append(report.seconds)
            return {key: values[1:] for key, values in times.items()}
        finally:
            child.kill()
            child.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=540.0, help="MiB to move (default: SmolLM2-135M fp32)")
    parser.add_argument("--chunk-mb", type=float, default=32.0)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    nbytes = payload_bytes(model_like(args.mb))
    print(f"moving {nbytes / 1e6:.1f} MB in {args.chunk_mb:g} MiB chunks, {args.reps} timed runs each, "
          f"{torch.get_num_threads()} torch threads, {len(model_like(args.mb))} tensors")
    times = run(args.mb, args.chunk_mb, args.reps)
    raw, push, pause = times["raw"], times["push"], times["pause"]

    def line(label: str, times: list[float]) -> str:
        med, best = statistics.median(times), min(times)
        return (f"{label:<26}: {nbytes / med / 1e9:5.2f} GB/s median, {nbytes / best / 1e9:5.2f} GB/s best"
                f"  (runs {[round(t, 3) for t in times]} s)")

    print(line("(a) raw chunked broadcast", raw))
    print(line("(b) WeightSender.push", push))
    print(f"    push / raw            : {statistics.median(raw) / statistics.median(push):.2f}x median, "
          f"{min(raw) / min(push):.2f}x best  (goal >= 0.8x)")
    print(line("    diagnostic: push, apply without copy", times["push_nocopy"]))
    pause_s = statistics.median(pause)
    print(f"    receiver pause        : {pause_s:.3f} s median inside apply_fn (generation paused), "
          f"{pause_s / statistics.median(push):.0%} of the push")


if __name__ == "__main__":
    main()
