"""Run a drmas command line as a child of a test, and never leave its processes behind.

`subprocess.run(..., timeout=...)` SIGKILLs only the child it started; `drmas run` starts its buffer,
learners and rollouts in sessions of their own, which a SIGKILL of the launcher orphans (they then hold
cores and ports for the rest of the suite). On a timeout this asks the launcher to stop (SIGTERM: it stops
its children), and only then kills it.
"""

from __future__ import annotations

import subprocess


def run_cli(command: list[str], timeout: float, grace_s: float = 30.0, **kwargs) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)``."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                stdout, stderr = proc.communicate(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
        except BaseException:
            proc.terminate()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
