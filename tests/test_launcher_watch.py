"""A pipeline process watches the launcher that started it (issue 33, defect 5): with real processes, a
"launcher" killed with SIGKILL, and children that stop cleanly or have to be killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from drmas.runtime.launcher_watch import LAUNCHER_ENV, launcher_alive, launcher_identity

CHILD = """
import sys, time
from drmas.runtime.launcher_watch import LauncherWatch
from drmas.runtime.process import StopFlag
stop = StopFlag()
LauncherWatch(stop, poll_s=0.05, grace_s=float(sys.argv[1])).start()
print("watching", flush=True)
if sys.argv[2] == "stops":
    stop.wait(60)
    print("stopped by", stop.signal_name, flush=True)
else:  # stuck where no flag is read
    time.sleep(60)
"""


@pytest.fixture
def launcher():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_launcher_is_alive_until_it_dies_or_its_pid_is_another_process(launcher):
    identity = launcher_identity(launcher.pid)
    assert launcher_alive(identity) and launcher_alive(launcher_identity())
    pid, started = identity.split(":")
    assert not launcher_alive(f"{pid}:{int(started) + 1}")  # the pid reused by a later process
    launcher.kill()
    deadline = time.monotonic() + 60  # until the kill has landed, however loaded the machine
    while launcher_alive(identity):  # a zombie (not reaped yet) is gone
        assert time.monotonic() < deadline, "a killed launcher still counts as alive"
        time.sleep(0.02)
    launcher.wait()
    assert not launcher_alive(identity)
    assert launcher_alive("not-a-pid")  # a malformed variable never stops a process


def _child(launcher, mode: str, grace_s: float) -> subprocess.Popen:
    env = {**os.environ, LAUNCHER_ENV: launcher_identity(launcher.pid)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(grace_s), mode], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    assert child.stdout.readline().strip() == "watching"
    return child


def test_a_child_stops_cleanly_when_its_launcher_is_killed(launcher):
    child = _child(launcher, "stops", grace_s=30)
    time.sleep(0.3)
    assert child.poll() is None  # the launcher lives: the child goes on
    launcher.send_signal(signal.SIGKILL)
    assert child.wait(60) == 0
    output = child.stdout.read()
    assert "stopped by the launcher's death" in output and "is gone: stopping at the next safe point" in output


def test_a_child_that_does_not_stop_is_killed_after_the_grace(launcher):
    child = _child(launcher, "stuck", grace_s=0.5)
    launcher.send_signal(signal.SIGKILL)
    assert child.wait(60) == -signal.SIGKILL
    assert "killing this process" in child.stdout.read()


def test_a_process_started_by_hand_watches_nothing():
    from drmas.runtime.launcher_watch import LauncherWatch
    from drmas.runtime.process import StopFlag

    assert LauncherWatch(StopFlag(install=False), identity="").start().thread is None
