"""What running plugin code in the plugin thread costs on the episode runner's per-step path.

The episode runner hands every plugin call (an episode's step, a scripted reply, a tool batch) to a thread of its
own, so one that blocks can be abandoned (`drmas.episodes.plugin_thread`, `rollout.plugin_call_timeout_s`). This
times the runner itself, with no model: episodes of a trivial orchestra (one agent turn after another) on an engine
that answers at once, so the driver's own work is all there is and the handoff is as large a share as it can be.
The same episodes run with plugin calls inline (`plugin_call_timeout_s=0`) and in the thread (the default), in
alternating repetitions; it prints the median microseconds per episode step (one turn: the engine's answer sent
into the episode, its next turn queued and submitted) of each, their difference, and the bare handoff (a no-op
call through the thread, less calling it).

    python bench/plugin_calls.py [--episodes 64] [--turns 32] [--reps 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.engines.base import Generation, SamplingParams  # noqa: E402
from drmas.mas.base import AgentTurn, EpisodeOutcome, TurnResult  # noqa: E402
from drmas.episodes.bounds import DEFAULT_BOUNDS  # noqa: E402
from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner  # noqa: E402
from drmas.episodes.plugin_thread import PluginThread  # noqa: E402
from drmas.tasks.base import Problem  # noqa: E402


class _Tokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **_):
        return [1, 2, 3]


class InstantEngine:
    """Answers every prompt at once with two tokens."""

    tokenizer = _Tokenizer()
    version = 0

    def generate(self, prompts, params):
        return [Generation([1, 2], [-0.5, -0.5], "ok", "stop", 0) for _ in prompts]


class Turns:
    agents = ("a",)
    tools: dict = {}

    def __init__(self, turns: int) -> None:
        self.turns = turns

    def run(self, problem):
        results = []
        for _ in range(self.turns):
            text = yield AgentTurn("a", [{"role": "user", "content": "q"}])
            results.append(TurnResult("a", text, True))
        return EpisodeOutcome(reward=1.0, turns=results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    requests = [EpisodeRequest(f"e{i}", "g", Problem(f"p{i}", "q", "1")) for i in range(args.episodes)]
    runners = {mode: EpisodeRunner(Turns(args.turns), {"m": InstantEngine()}, {"a": AgentSpec("m", SamplingParams())},
                                   invalid_penalty=0.0, seed=0, bounds=bounds)
               for mode, bounds in (("inline", dataclasses.replace(DEFAULT_BOUNDS, call_timeout_s=0.0)),
                                    ("thread", DEFAULT_BOUNDS))}
    steps = args.episodes * (args.turns + 1)  # each turn's step, and the one that ends the episode
    times: dict[str, list[float]] = {mode: [] for mode in runners}
    for mode, runner in runners.items():
        runner.run(requests)  # warm-up
    for _ in range(args.reps):
        for mode, runner in runners.items():
            start = time.perf_counter()
            runner.run(requests)
            times[mode].append((time.perf_counter() - start) / steps * 1e6)
    median = {mode: statistics.median(values) for mode, values in times.items()}
    for mode, value in median.items():
        print(f"{mode:>7}: {value:6.1f} us per episode step (median of {args.reps}; {steps} steps a run)")
    print(f"   cost: {median['thread'] - median['inline']:6.1f} us per step in the plugin thread")
    print(f"handoff: {handoff():6.1f} us per call through the plugin thread, less calling inline")


def handoff(calls: int = 20000) -> float:
    plugins, noop = PluginThread(), (lambda: None)
    start = time.perf_counter()
    for _ in range(calls):
        noop()
    inline = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        plugins.call(noop, deadline=time.monotonic() + 60)
    return (time.perf_counter() - start - inline) / calls * 1e6


if __name__ == "__main__":
    main()
