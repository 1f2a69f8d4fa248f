"""Throughput of producer -> trajectory buffer -> consumer against raw pyzmq PUSH/PULL of the same messages.

Each episode has two samples (solver + verifier), four episodes per group, in two sizes: 10 KiB samples
(1024-token prompt, 768-token response: 1792 token ids and 768 behaviour log-probs, packed) and 32k-token
samples (24k-token prompt, 8k-token response: 128 KiB of ids and 32 KiB of log-probs). Every side runs in
its own process, as in a real deployment. Three runs per size:

* buffer:        BufferProducer.send_episode -> TrajectoryBuffer -> BufferConsumer.pull (decoded groups)
* raw, same work: PUSH of msgspec-encoded EpisodeMsg -> PULL + decode, holding as many decoded samples
                 at a time as one buffer pull returns (the endpoints do what ours do)
* raw transport: PUSH of pre-encoded bytes -> PULL, no decoding (the wire's ceiling)
* relays:        the raw transport with a forwarding process between the two ends, as the buffer sits
                 there: a Python one (`recv_multipart` -> `send_multipart`, no copies, no decoding; what any
                 buffer written in Python costs at the least) and libzmq's own `zmq.proxy` (no Python at all)

The headline is one line per size, `buffer/raw_wire = X.XXx`: the buffer path (decoded arrays at the
consumer) against the wire's ceiling. The relays say how much of the gap the second hop alone costs on
the machine at hand, whatever a buffer does: `buffer/python_relay` is the share of a do-nothing Python
forwarder's rate that the buffer keeps while it checks, stores and schedules. On a shared machine the rates swing with whatever else runs, so each
size also prints the CPU time (all threads, ZeroMQ's I/O thread included) each process of the buffer path spent
per sample, the least of the repeats: a cost figure that load elsewhere disturbs far less than a rate. The
script runs on checkouts from before message schema 3 too, for before/after figures in the same conditions.

    python bench/buffer.py [--sizes 10KiB,32k] [--episodes 3000] [--window 32]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import resource
import threading
import time

import zmq

AGENTS = {"solver": "m1", "verifier": "m2"}
GROUP_SIZE = 4
# name -> (prompt tokens, response tokens, default episodes per run: 20-30 MB through each path)
SIZES = {"10KiB": (1024, 768, 1000), "32k": (24576, 8192, 100)}
DESCRIPTIONS = {"10KiB": "10 KiB samples: 1792 token ids, 768 log-probs",
                "32k": "32k-token samples: 128 KiB of ids, 32 KiB of log-probs"}


def make_episodes(n_episodes: int, shape: tuple[int, int], seed: int = 0) -> list[tuple[str, str, list]]:
    """(group_id, episode_id, samples) per episode; built in each process, outside the timed part. The
    arrays are handed over as lists, so the same script measures a checkout from before packed samples."""
    from drmas.core.sample import Sample

    rng = random.Random(seed)
    n_prompt, n_response = shape
    prompt = [rng.randrange(50_000) for _ in range(n_prompt)]
    response = [rng.randrange(50_000) for _ in range(n_response)]
    logprobs = [-rng.random() for _ in range(n_response)]
    episodes = []
    for index in range(n_episodes):
        group_id, episode_id = f"g{index // GROUP_SIZE}", f"e{index}"
        samples = [
            Sample(
                episode_id=episode_id, group_id=group_id, agent=agent, model=model, turn=turn,
                prompt_ids=prompt[index % 7:] + prompt[:index % 7], response_ids=response,
                behaviour_logprobs=logprobs,
                policy_version=0, temperature=1.0, valid=True, reward=rng.random(),
            )
            for turn, (agent, model) in enumerate(AGENTS.items())
        ]
        episodes.append((group_id, episode_id, samples))
    return episodes


def _cpu_s() -> float:
    """CPU seconds this process spent so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _codec():
    """(encode a message to its frames, decode received frames) of the checkout under test."""
    try:
        from drmas.buffer.framing import decode_message, encode_frames
    except ImportError:  # before message schema 3: every message was one frame
        from drmas.buffer.messages import decode_message, encode_message
        return (lambda message: [encode_message(message)]), (lambda frames: decode_message(frames[0].buffer))
    return encode_frames, decode_message


def _start_when_ready(ready: mp.Event, go: mp.Event) -> None:
    """Start the clock only once the producer has built its episodes and connected."""
    if not ready.wait(300):
        raise TimeoutError("producer did not get ready")
    time.sleep(0.2)  # let the connection settle
    go.set()


# ---- buffer path ----------------------------------------------------------------------------------


def run_buffer_server(endpoints: mp.Queue, stop: mp.Event, capacity: int, validate: bool, window: int,
                      cpu: mp.Queue) -> None:
    from drmas.buffer import BufferConfig, TrajectoryBuffer

    config = BufferConfig(producer_endpoint="tcp://127.0.0.1:0", consumer_endpoint="tcp://127.0.0.1:0",
                          capacity_samples=capacity, validate_samples=validate, window=window,
                          max_message_bytes=64 << 20)
    buffer = TrajectoryBuffer(config, agent_models=AGENTS).start()
    endpoints.put((buffer.producer_endpoint, buffer.consumer_endpoint))
    start = _cpu_s()  # its idle ticks until the producer is ready cost next to nothing
    stop.wait()
    cpu.put(("buffer", _cpu_s() - start))
    buffer.stop()


def run_buffer_producer(endpoint: str, n_episodes: int, shape: tuple[int, int], window: int, ready: mp.Event,
                        go: mp.Event, cpu: mp.Queue) -> None:
    from drmas.buffer import BufferProducer

    episodes = make_episodes(n_episodes, shape)
    with BufferProducer(endpoint, "bench", window=window, timeout_s=60) as producer:
        ready.set()
        go.wait()
        start = _cpu_s()
        for group_id, episode_id, samples in episodes:
            producer.send_episode(group_id, GROUP_SIZE, episode_id, samples)
        producer.flush()
        cpu.put(("producer", _cpu_s() - start))


def bench_buffer(n_episodes: int, shape: tuple[int, int], window: int, capacity: int, validate: bool,
                 pull_groups: int) -> tuple[float, dict[str, float]]:
    """Samples/s through the buffer path, and each process's CPU microseconds per sample."""
    from drmas.buffer import BufferConsumer

    endpoints, stop, ready, go, cpu = mp.Queue(), mp.Event(), mp.Event(), mp.Event(), mp.Queue()
    server = mp.Process(target=run_buffer_server, args=(endpoints, stop, capacity, validate, window, cpu))
    server.start()
    producer_endpoint, consumer_endpoint = endpoints.get(timeout=60)
    producer = mp.Process(target=run_buffer_producer,
                          args=(producer_endpoint, n_episodes, shape, window, ready, go, cpu))
    producer.start()
    total = n_episodes * len(AGENTS)
    spent = {}
    try:
        with BufferConsumer(consumer_endpoint, timeout_s=60) as consumer:
            consumer.stats()  # connected before the clock starts
            _start_when_ready(ready, go)
            start, received, cpu_start = time.perf_counter(), 0, _cpu_s()
            while received < total:
                groups = consumer.pull(list(AGENTS), max_groups=pull_groups, wait_ms=1000)
                received += sum(len(g.samples) for g in groups)
                if not groups and time.perf_counter() - start > 600:
                    raise TimeoutError(f"buffer path stalled at {received} of {total} samples")
            elapsed = time.perf_counter() - start
            spent["consumer"] = _cpu_s() - cpu_start
    finally:
        producer.join(60)
        stop.set()
        server.join(60)
    for _ in range(2):
        name, seconds = cpu.get(timeout=60)
        spent[name] = seconds
    return total / elapsed, {name: spent[name] / total * 1e6 for name in ("producer", "buffer", "consumer")}


# ---- raw pyzmq path -------------------------------------------------------------------------------


def run_raw_producer(endpoint: str, n_episodes: int, shape: tuple[int, int], pre_encode: bool, ready: mp.Event,
                     go: mp.Event) -> None:
    """Pre-encoded: each episode's frames joined into one message (the same bytes, the wire's ceiling);
    otherwise each episode encoded into its frames in the timed part, as `BufferProducer` does."""
    from drmas.buffer.messages import EpisodeMsg

    encode_frames, _ = _codec()
    messages = [
        EpisodeMsg(producer="bench", seq=i, group_id=g, group_size=GROUP_SIZE, episode_id=e, samples=s)
        for i, (g, e, s) in enumerate(make_episodes(n_episodes, shape))
    ]
    payloads = [b"".join(encode_frames(m)) for m in messages] if pre_encode else None
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.connect(endpoint)
    ready.set()
    go.wait()
    if payloads is not None:
        for payload in payloads:
            sock.send(payload)
    else:
        for message in messages:
            sock.send_multipart(encode_frames(message))
    sock.close(linger=-1)
    context.term()  # waits until every message is out: a multiprocessing child ends in os._exit, dropping the rest


def bench_raw(n_episodes: int, shape: tuple[int, int], decode: bool, hold_samples: int) -> float:
    """PULL side; decoded episodes are held until `hold_samples` accumulate, as a buffer pull holds them."""
    _, decode_frames = _codec()
    sock = zmq.Context.instance().socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    ready, go = mp.Event(), mp.Event()
    producer = mp.Process(target=run_raw_producer,
                          args=(f"tcp://127.0.0.1:{port}", n_episodes, shape, not decode, ready, go))
    producer.start()
    _start_when_ready(ready, go)
    start, received, total = time.perf_counter(), 0, n_episodes * len(AGENTS)
    held: list = []
    while received < total:
        if not sock.poll(60_000):
            raise TimeoutError(f"raw producer stalled at {received} of {total}")
        if decode:
            held.append(decode_frames(sock.recv_multipart(copy=False)))
        else:
            sock.recv()
        received += len(AGENTS)
        if len(held) * len(AGENTS) >= hold_samples:
            held = []
    elapsed = time.perf_counter() - start
    producer.join(60)
    sock.close(linger=0)
    return total / elapsed


def run_relay(endpoints: mp.Queue, in_python: bool, cpu: mp.Queue, stop: mp.Event) -> None:
    """Forward every message from a PULL socket to a PUSH socket until `stop`; report the CPU it took."""
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    endpoints.put(tuple(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}" for sock in (pull, push)))
    start = _cpu_s()
    if in_python:  # the leanest loop Python has: a blocking receive (timing out to look at `stop`), a send
        pull.rcvtimeo = 100
        while not stop.is_set():
            try:
                push.send_multipart(pull.recv_multipart(copy=False), copy=False)
            except zmq.Again:
                pass
    else:  # libzmq's proxy runs until its control socket hears TERMINATE
        control = context.socket(zmq.PAIR)
        control.bind("inproc://relay-control")
        terminate = context.socket(zmq.PAIR)
        terminate.connect("inproc://relay-control")
        threading.Thread(target=lambda: (stop.wait(), terminate.send(b"TERMINATE")), daemon=True).start()
        zmq.proxy_steerable(pull, push, None, control)
    cpu.put(_cpu_s() - start)
    context.destroy(linger=0)


def bench_relay(n_episodes: int, shape: tuple[int, int], in_python: bool) -> tuple[float, float]:
    """Samples/s of pre-encoded episodes through a relay process, and the relay's CPU microseconds per sample."""
    endpoints, cpu, stop, ready, go = mp.Queue(), mp.Queue(), mp.Event(), mp.Event(), mp.Event()
    relay = mp.Process(target=run_relay, args=(endpoints, in_python, cpu, stop))
    relay.start()
    front, back = endpoints.get(timeout=60)
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.connect(back)
    producer = mp.Process(target=run_raw_producer, args=(front, n_episodes, shape, True, ready, go))
    producer.start()
    try:
        _start_when_ready(ready, go)
        start, received, total = time.perf_counter(), 0, n_episodes * len(AGENTS)
        while received < total:
            if not sock.poll(60_000):
                raise TimeoutError(f"relay stalled at {received} of {total}")
            sock.recv()
            received += len(AGENTS)
        elapsed = time.perf_counter() - start
    finally:
        producer.join(60)
        stop.set()
        sock.close(linger=0)
    spent = cpu.get(timeout=60)
    relay.join(60)
    return total / elapsed, spent / total * 1e6


def bench_size(name: str, args: argparse.Namespace) -> None:
    """Interleaved runs of the three paths for one sample size; prints the best rates and the headline."""
    n_prompt, n_response, default_episodes = SIZES[name]
    shape, episodes = (n_prompt, n_response), args.episodes or default_episodes
    # 4096 samples of 1k tokens as before; at least 1024, so 32k-token samples do not run in lockstep
    capacity = args.capacity or max(1024, (4096 * 1024) // (n_prompt + n_response))
    hold = args.pull_groups * GROUP_SIZE
    runs: dict[str, list[float]] = {"buffer": [], "raw_work": [], "raw_wire": [], "python_relay": [], "c_relay": []}
    cpu: dict[str, list[float]] = {"producer": [], "buffer": [], "consumer": []}
    relay_cpu: dict[str, list[float]] = {"python_relay": [], "c_relay": []}
    for _ in range(args.repeats):  # interleaved, so a burst of load elsewhere hits every path alike
        rate, spent = bench_buffer(episodes, shape, args.window, capacity, not args.no_validate, args.pull_groups)
        runs["buffer"].append(rate)
        for process, us in spent.items():
            cpu[process].append(us)
        runs["raw_work"].append(bench_raw(episodes, shape, decode=True, hold_samples=hold))
        runs["raw_wire"].append(bench_raw(episodes, shape, decode=False, hold_samples=hold))
        for relay, spent_us in relay_cpu.items():
            rate, us = bench_relay(episodes, shape, in_python=relay == "python_relay")
            runs[relay].append(rate)
            spent_us.append(us)
    best = {path: max(rates) for path, rates in runs.items()}
    print(f"[{DESCRIPTIONS[name]}; {episodes} episodes a run]")
    print("samples/s per run:", {path: [round(r) for r in rates] for path, rates in runs.items()})
    print(f"buffer (producer -> buffer -> consumer): {best['buffer']:10.0f} samples/s (best of {args.repeats})")
    print(f"raw PUSH/PULL, encode + decode:          {best['raw_work']:10.0f} samples/s   "
          f"ratio buffer/raw = {best['buffer'] / best['raw_work']:.2f}x")
    print(f"raw PUSH/PULL, pre-encoded, no decode:   {best['raw_wire']:10.0f} samples/s")
    wire = best["raw_wire"]
    print(f"relay in Python, no work:                {best['python_relay']:10.0f} samples/s   "
          f"{best['python_relay'] / wire:.2f}x of the wire, relay CPU {min(relay_cpu['python_relay']):.1f} us/sample")
    print(f"relay in libzmq (zmq.proxy):             {best['c_relay']:10.0f} samples/s   "
          f"{best['c_relay'] / wire:.2f}x of the wire, relay CPU {min(relay_cpu['c_relay']):.1f} us/sample")
    print("buffer path CPU per sample (least of the repeats): "
          + ", ".join(f"{process} {min(us):.1f} us" for process, us in cpu.items())
          + f", total {sum(min(us) for us in cpu.values()):.1f} us")
    print(f"buffer/python_relay = {best['buffer'] / best['python_relay']:.2f}x")
    print(f"buffer/raw_wire = {best['buffer'] / wire:.2f}x  ({DESCRIPTIONS[name]})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated sample sizes of {list(SIZES)}")
    parser.add_argument("--episodes", type=int, default=0,
                        help="episodes per run (2 samples each); default: per size, 20-30 MB a run")
    parser.add_argument("--window", type=int, default=32, help="producer window (unacknowledged episodes)")
    parser.add_argument("--capacity", type=int, default=0,
                        help="buffer capacity in samples (default: per size, 4M tokens and at least 1024 samples)")
    parser.add_argument("--pull-groups", type=int, default=32,
                        help="max agent groups per pull, like a learner collecting a step; the raw consumer holds "
                             "as many decoded samples at once (holding many costs Python more per sample)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per path; the best is kept")
    parser.add_argument("--no-validate", action="store_true", help="buffer checks only sample routing headers")
    args = parser.parse_args()
    mp.set_start_method("spawn")
    for name in args.sizes.split(","):
        if name not in SIZES:
            parser.error(f"unknown size {name!r}; known: {list(SIZES)}")
        bench_size(name, args)


if __name__ == "__main__":
    main()
