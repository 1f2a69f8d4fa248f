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

ROOT = Path(__file__).resolve().parents[1]

RANK = """
import os, sys, time
from pathlib import Path
from drmas.process import die_with_torchrun
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
