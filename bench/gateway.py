"""Episodes/s of the math system through the gateway vs the in-process orchestra, on one engine and config.

Both paths run the same episodes (problems, episode ids, hence per-call seeds) on the same embedded engine, with
`EpisodeRunner.stream` keeping `--in-flight` episodes live as a rollout does. In-process: the built-in math
orchestra. Through the gateway: examples/openai_agents/agents.py, plain `openai` client code that the external
system starts and that makes every call over HTTP (in its own process, so on this machine's cores beside the
engine). Rounds alternate between the two paths (the machine's load drifts), each path warmed up first (imports,
the program's start); the ratio of the median rates is printed, with the CPU time per episode of each path (this
process: driver, engine, HTTP server thread; plus the program's process; a figure a busy machine disturbs far less
than the rates) and the share of calls whose tokens were the same on both paths (the gateway reproduces the
in-process system call for call; batches differ, so a rare token may too).

`--stream`: the program streams every call (`stream=True`, bench/gateway_streamed_program.py: the example with its
chunks joined back into the reply), so the gateway path is measured with server-sent answers.

    python bench/gateway.py [--config examples/openai_agents/config.yaml] [--episodes 64] [--in-flight 16]
                            [--rounds 3] [--stream] [key=value ...]      (e.g. models.policy.tiny.hidden_size=512)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from drmas import assembly
from drmas.episodes import EpisodeRequest, EpisodeResult, EpisodeRunner

ROOT = Path(__file__).resolve().parents[1]


def stream(runner: EpisodeRunner, requests: list[EpisodeRequest], in_flight: int) -> tuple[float, list[EpisodeResult]]:
    """Run `requests` keeping `in_flight` live; (seconds from the first admission to the last result, results)."""
    queue, results = list(requests), []

    def admit(live: int):
        if not queue:
            return None
        batch = queue[: max(in_flight - live, 0)]
        del queue[: len(batch)]
        return batch

    start = time.perf_counter()
    runner.stream(admit, results.append)
    return time.perf_counter() - start, results


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (Linux /proc), 0 when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """User + system CPU time of this process (the driver, the engine and the gateway's server thread)."""
    times = os.times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "openai_agents" / "config.yaml"))
    parser.add_argument("--episodes", type=int, default=64, help="episodes per round and path")
    parser.add_argument("--in-flight", type=int, default=16, help="episodes live at once (the program's threads)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream", action="store_true", help="the program streams its calls (server-sent events)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    group = 4
    overrides = [f"system.workdir={ROOT / 'examples' / 'openai_agents'}", f"rollout.group_size={group}",
                 f"pipeline.groups_in_flight={max(args.in_flight // group, 1)}", *args.overrides]
    if args.stream:
        overrides.append(f'system.command=["python", "{ROOT / "bench" / "gateway_streamed_program.py"}"]')
    cfg = assembly.load_config(args.config, overrides)
    inside_cfg = assembly.load_config(args.config, [*overrides, "system.name=math"])
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    task = assembly.build_task(cfg)
    engines = {m: assembly.build_engine(cfg, m, assembly.model_path(cfg, m), 0) for m in cfg.models}
    outside = EpisodeRunner(assembly.build_orchestra(cfg, task), engines, assembly.agent_specs(cfg),
                            cfg.algorithm.invalid_penalty, seed=0)
    inside = EpisodeRunner(assembly.build_orchestra(inside_cfg, task), engines, assembly.agent_specs(inside_cfg),
                           inside_cfg.algorithm.invalid_penalty, seed=0)
    problems = list(task.split("train"))

    def requests(tag: str) -> list[EpisodeRequest]:
        return [EpisodeRequest(f"{tag}-g{g}-e{e}", f"{tag}-g{g}", problems[g % len(problems)])
                for g in range(args.episodes // group) for e in range(group)]

    rates: dict[str, list[float]] = {"in-process": [], "gateway": []}
    cpu_per_episode: dict[str, list[float]] = {"in-process": [], "gateway": []}
    same = calls = 0
    try:
        for runner in (inside, outside):  # warm-up: imports, first forward passes, the program's start
            stream(runner, requests("warm")[: args.in_flight], args.in_flight)
        for r in range(args.rounds):
            ran = {}
            for name, runner in (("in-process", inside), ("gateway", outside))[:: 1 if r % 2 == 0 else -1]:
                program = getattr(runner.orchestra, "program", None)
                cpu, own = cpu_seconds(program.pid if program else None), own_cpu_seconds()
                seconds, results = stream(runner, requests(f"r{r}"), args.in_flight)
                own = own_cpu_seconds() - own
                theirs = cpu_seconds(program.pid) - cpu if program else 0.0
                rates[name].append(len(results) / seconds)
                cpu_per_episode[name].append((own + theirs) / len(results))
                ran[name] = {res.request.episode_id: res for res in results}
                n_calls = sum(len(res.samples) for res in results)
                extra = f", the program's CPU {1000 * theirs / n_calls:.1f} ms per call" if program else ""
                print(f"round {r} {name:>10}: {len(results)} episodes in {seconds:6.2f} s = {rates[name][-1]:6.2f} "
                      f"episodes/s, CPU {1000 * cpu_per_episode[name][-1]:.0f} ms per episode ({n_calls} calls, "
                      f"{sum(len(s.response_ids) for res in results for s in res.samples)} tokens{extra})")
            for episode_id, a in ran["gateway"].items():
                b = ran["in-process"][episode_id]
                for s, t in zip(a.samples, b.samples):
                    calls += 1
                    same += list(s.response_ids) == list(t.response_ids) and list(s.prompt_ids) == list(t.prompt_ids)
    finally:
        assembly.close_orchestra(outside.orchestra)
    inside_rate, gateway_rate = statistics.median(rates["in-process"]), statistics.median(rates["gateway"])
    inside_cpu, gateway_cpu = statistics.median(cpu_per_episode["in-process"]), statistics.median(cpu_per_episode["gateway"])
    print(f"median episodes/s: in-process {inside_rate:.2f}, gateway {gateway_rate:.2f}; "
          f"gateway / in-process = {gateway_rate / inside_rate:.2f}x (goal >= 0.8x); "
          f"median CPU per episode: in-process {1000 * inside_cpu:.0f} ms, gateway {1000 * gateway_cpu:.0f} ms "
          f"(program included): in-process / gateway = {inside_cpu / gateway_cpu:.2f}x; "
          f"identical calls {same}/{calls}; torch threads {torch.get_num_threads()}; "
          f"{'streamed' if args.stream else 'not streamed'}")


if __name__ == "__main__":
    main()
