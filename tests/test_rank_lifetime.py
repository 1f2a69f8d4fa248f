"""Learner ranks end with their torchrun: torchrun starts each rank in a session of its own, so a SIGKILL of
torchrun (a launcher's last resort, or a Ray actor lost with its node's worker) reached none of them, and
the ranks lived on, holding devices and ports, blocked in collectives without a peer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]

RANK = """
import os, sys, time
from pathlib import Path
from drmas.runtime.process import die_with_torchrun
if sys.argv[2] == "bound":
    die_with_torchrun()
Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; it only waits for a parent's wait()
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def _rank_pids_after_killing_torchrun(tmp_path: Path, mode: str) -> list[int]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    pids_dir = tmp_path / mode
    pids_dir.mkdir()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                "127.0.0.1", "--master-port", "0", str(script), str(pids_dir), mode]
    proc = subprocess.Popen(torchrun, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(pids_dir.iterdir())) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "torchrun did not start both ranks"
            time.sleep(0.1)
        time.sleep(0.2)  # both pid files written in full
        pids = [int(f.read_text()) for f in pids_dir.iterdir()]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [p for p in pids if _alive(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_bound_to_torchrun_end_with_it_and_unbound_ones_outlive_it(tmp_path):
    assert _rank_pids_after_killing_torchrun(tmp_path, "bound") == []
    # the control: without the binding the ranks outlive a killed torchrun (what the binding is for)
    assert len(_rank_pids_after_killing_torchrun(tmp_path, "unbound")) == 2


def _order_waiter(rank: int, port: int, keepalive: bool, result: str) -> None:
    """Rank 0 waits 2.5 s (as for a batch) before its stop order, sending keepalives or not; rank 1 waits for
    orders as `follow` does, in a group whose broadcasts time out after 1 s."""
    import torch
    import torch.distributed as dist

    from drmas.learner.ranks.group import BatchFanout
    from drmas.learner.ranks.sharding import ShardedRanks

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    fanout = BatchFanout(ShardedRanks(torch.device("cpu")), timeout_s=1.0, keepalive_s=0.3)
    try:
        if rank == 0:
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                if keepalive:
                    fanout.keepalive()
                time.sleep(0.05)
            fanout.finish()
        else:
            orders = []
            while (order := fanout.receive()) is not None:
                orders.append(order[0])
            Path(result).write_text(",".join(orders))
    except RuntimeError as exc:
        if rank == 1:
            Path(result).write_text(f"failed: {exc}")
    finally:
        dist.destroy_process_group()


def test_the_other_ranks_wait_for_orders_as_long_as_rank_0_waits_for_a_batch(tmp_path):
    """Ranks 1..N-1 wait for rank 0's next order inside a broadcast that fails after its timeout (600 s): a
    learner whose rollouts took longer than that to deliver (a first vLLM start of a large model, every
    rollout lost) ended. Rank 0's keepalive orders while it waits keep them."""
    import socket

    import torch.multiprocessing as tmp

    runs = {}
    for keepalive in (True, False):  # both pairs at once
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = tmp_path / f"keepalive-{keepalive}"
        runs[keepalive] = (result, tmp.start_processes(_order_waiter, args=(port, keepalive, str(result)), nprocs=2,
                                                       join=False, start_method="spawn"))
    try:
        deadline = time.monotonic() + 120
        for keepalive, (_, ctx) in runs.items():
            try:
                while not ctx.join(timeout=1.0):
                    assert time.monotonic() < deadline, "ranks still running"
            except tmp.ProcessRaisedException:
                if keepalive:
                    raise  # without keepalives rank 0's finish may fail once rank 1 gave up: expected
    finally:
        for _, ctx in runs.values():
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    kept = runs[True][0].read_text()
    assert kept.split(",")[:3] == ["idle"] * 3, kept
    broken = runs[False][0].read_text()  # the control: the same wait without keepalives breaks the follower's wait
    assert broken.startswith("failed"), broken
