"""Calls per second of the sandbox service on a trivial program, against bare interpreter starts in the same run.

For each pool size N, the same number of calls go through `SandboxService.call_batch` (a working directory,
the launcher, namespaces or seccomp, resource limits, the program, the sweep and cleanup) and through a
bare ``python -I -c pass`` subprocess per call on N threads: the ratio is the sandbox's rate over that
baseline, and the per-call overhead is the difference of their mean latencies at N=1. Run once with the
default network isolation and once with the seccomp fallback (no namespaces; as root that needs an
interpreter every user may read: where this one is not, e.g. under /root, the row says why it is missing).

    python bench/sandbox.py [--calls 40] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from drmas.config.sandbox import SandboxConfig
from drmas.tools import SandboxService, SandboxUnavailable

PROGRAM = "pass"


def bare(calls: int, workers: int) -> float:
    """Seconds for `calls` bare `python -I -c pass` runs, `workers` at a time."""
    def one(_):
        subprocess.run([sys.executable, "-I", "-c", PROGRAM], check=True, stdin=subprocess.DEVNULL)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(calls)))
    return time.perf_counter() - start


def sandboxed(calls: int, workers: int, methods: list[str]) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o711)  # as the default tmp_dir: the program's uid may search it, also without namespaces
        with SandboxService(SandboxConfig(workers=workers, network_isolation=methods, tmp_dir=tmp)) as service:
            start = time.perf_counter()
            results = service.call_batch([PROGRAM] * calls)
            elapsed = time.perf_counter() - start
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"a trivial program failed in the sandbox: {bad[0]}")
    return elapsed, results[0].network


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    rows = []
    for methods in (["netns", "userns", "seccomp"], ["seccomp"]):
        for workers in args.workers:
            base = bare(args.calls, workers)
            try:
                took, network = sandboxed(args.calls, workers, methods)
            except SandboxUnavailable as exc:
                print(f"{'/'.join(methods)}: {exc}")
                break
            rows.append({"network": network, "workers": workers, "calls": args.calls,
                         "sandbox_calls_per_s": args.calls / took, "bare_calls_per_s": args.calls / base,
                         "ratio": base / took, "sandbox_ms": 1000 * took / args.calls * workers,
                         "bare_ms": 1000 * base / args.calls * workers})
    print(json.dumps(rows, indent=1))
    print(f"\n{'network':<9}{'workers':>8}{'sandbox calls/s':>17}{'bare calls/s':>14}{'ratio':>8}"
          f"{'ms/call (N=1: overhead)':>26}")
    for row in rows:
        overhead = f" (+{row['sandbox_ms'] - row['bare_ms']:.0f})" if row["workers"] == 1 else ""
        print(f"{row['network']:<9}{row['workers']:>8}{row['sandbox_calls_per_s']:>17.1f}"
              f"{row['bare_calls_per_s']:>14.1f}{row['ratio']:>7.2f}x{row['sandbox_ms']:>18.0f}{overhead}")


if __name__ == "__main__":
    main()
