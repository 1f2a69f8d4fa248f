"""What every launcher of the async pipeline shares: the run around the processes and their supervision.

A launcher (local OS processes, Ray actors, ...) differs only in *where* a process runs and how its
endpoints are found; the rest is one policy, kept here so both behave alike:

* everything that could refuse the run is checked before anything is written or started: the output
  directory (one that holds another run is refused unless resuming or overwriting, see
  `drmas.runtime.run_dir`), every data file (the task is built), every model (built once up front: children
  would otherwise all build the same cached model at once), what the machine or cluster must offer (devices,
  ports, CPUs) and the initial held-out evaluation; a refusal ends the run with one message (exit 2) and
  leaves nothing behind, so the corrected command is not refused for a directory the failed one claimed.
  Only then is the output directory claimed, the processes placed and their config written,
* held-out problems are scored with the initial models before anything starts and with the learners' final
  checkpoints after they finish (`eval.n_problems`; see `drmas.evaluation.async_heldout`); with
  `eval.interval` the final version's interval evaluation is made then too (rollout 0 makes the others),
* the buffer, one learner per trained model and `pipeline.num_rollouts` rollouts are started in that order,
  their output merged line by line behind a `[name]` prefix (each process also logs to its own directory),
* a process that dies is restarted (`drmas.runtime.restarts`: bounded, with backoff; a learner with
  `trainer.resume=true`, so it continues from its last checkpoint); the run ends when every learner has
  finished (0), when a process cannot be recovered (1: it refused its input, or used up its restarts; the
  launcher says which), or on SIGINT/SIGTERM (130): rollouts are stopped first (nothing new is generated),
  then learners (they write their checkpoint), the buffer last, and the launcher names each learner's newest
  checkpoint and how to continue (`drmas.launch.run_report`). A process that ignores the stop for
  `STOP_GRACE_S` is killed.

A backend supplies `Child` (start, poll, stop one process) and `_place` (fix the endpoints, write nothing
else); `LocalLauncher` and `RayLauncher` are the two.
"""

from __future__ import annotations

import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TextIO

from drmas import assembly
from drmas.config.load import to_yaml
from drmas.config.schema import DrmasConfig
from drmas.runtime.restarts import RestartBook
from drmas.runtime.process import StopFlag

STOP_GRACE_S = 60.0
STOP_ORDER = ("rollout", "learner", "buffer")
RESUME = "trainer.resume=true"


@dataclass
class Child(ABC):
    """One pipeline process as a launcher sees it: `python -m module --config <config> *args`."""

    name: str
    role: str  # buffer, learner or rollout
    module: str
    args: list[str]
    restart_at: Optional[float] = None  # set while it waits to be restarted
    finished: bool = False  # a learner that reached its last step
    retired: bool = False  # a rollout removed on request (elastic runs): not restarted, not waited for
    pids: list[int] = field(default_factory=list)  # every pid it ran under, newest last

    @abstractmethod
    def spawn(self) -> str:
        """Start the process (again); returns where it runs, for the `started ...` line."""

    def placed(self) -> bool:
        """Whether it has a place to (re)start in now; asked every supervision round while it waits to be
        restarted, so a backend whose placement takes time (a cluster finding room) does not hold up the
        supervision of every other process. PlacementError once it cannot be placed. Here: always."""
        return True

    @abstractmethod
    def poll(self) -> Optional[int]:
        """None while it runs; else its exit code (negative: killed by that signal; LOST: its host vanished
        without one)."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its process group)."""

    @abstractmethod
    def kill(self) -> None:
        """Stop it now (SIGKILL to its process group)."""

    def close(self) -> None:
        """Release what holds its output once it has stopped."""


LOST = -1_000_000  # `Child.poll` of a process whose host vanished (no exit code to report)


class PlacementError(RuntimeError):
    """A process could not be given a place to run (a cluster without the resources it asks for)."""


class Supervisor(ABC):
    """Runs the pipeline: prepare, start, supervise, stop, evaluate; `launch` of every backend."""

    poll_interval_s = 0.2

    def __init__(self, cfg: DrmasConfig, out: TextIO = sys.stdout) -> None:
        self.cfg = cfg
        self.out = out
        self.children: list[Child] = []
        self.restarts = RestartBook(cfg.pipeline.restarts)
        self._print_lock = threading.Lock()
        self.config_file: Optional[Path] = None
        self.task = None  # the task, built once by `_check` (its data files read) for both held-out evaluations

    # ---- what a backend provides ---------------------------------------------------------------------
    @abstractmethod
    def _place(self) -> None:
        """Decide where every process runs and fix `self.cfg`'s endpoints (no port 0 left); may raise
        ValueError with a message naming what cannot be placed."""

    @abstractmethod
    def _child(self, name: str, role: str, module: str, args: list[str]) -> Child:
        """A not yet started process of this backend."""

    def _check_machine(self) -> None:
        """Refuse (ValueError) what the processes could not get where they run: called before the output
        directory is claimed, so it must write nothing there."""

    def _tick(self) -> None:
        """Called on every supervision round (elastic changes, output of remote processes)."""

    def _shutdown(self) -> None:
        """Release what the backend holds, after every process stopped."""

    # ---- the run -------------------------------------------------------------------------------------
    def run(self) -> int:
        """0 when every learner finished its steps; 1 when a process could not be recovered; 2 when the run
        could not start (output directory, data, models, machine, placement); 130 when interrupted."""
        from drmas.launch.run_report import log_accuracy, logged_accuracy, report_pace, resume_hint

        stop = StopFlag()
        try:
            accuracy = {}
            try:
                self._check()
                stop.reclaim()  # joining a cluster (ray.init) may have put its own handlers on the signals
                if not self.cfg.trainer.resume:  # builds the system as the rollouts will (its retriever's corpus
                    accuracy["before"] = self._heldout("before")  # included): the same refusals, before anything
                if stop.is_set():  # Ctrl-C during the checks or the initial evaluation: nothing written yet
                    self._say("launcher", f"{stop.signal_name} received before any process started: stopping")
                    return 130
                run_dir = self._claim()
                if "before" in accuracy:  # at step 0, as the colocated loop logs it; a resumed run reads it back
                    log_accuracy(self.cfg, run_dir, 0, {"before": accuracy["before"]})
                else:
                    accuracy["before"] = logged_accuracy(run_dir, "before")
            except (FileNotFoundError, ValueError, ImportError) as exc:
                print(f"drmas: {exc}", file=sys.stderr)
                return 2
            try:
                try:
                    self._start("buffer", "buffer", "drmas.buffer.main", [])
                    for process in assembly.learner_processes(self.cfg):
                        self._start(f"learner-{process}", "learner", "drmas.learner.main", ["--model", process])
                    for index in range(self.cfg.pipeline.num_rollouts):
                        self.add_rollout(index)
                except PlacementError as exc:
                    self._say("launcher", f"{exc}: stopping the run")
                    code = 1
                else:
                    code = self._watch(stop)
            finally:
                self._stop_all()
            if code == 0:
                from drmas.evaluation.async_heldout import final_checkpoint_dirs

                accuracy["after"] = self._heldout("after", final_checkpoint_dirs(self.cfg))
                log_accuracy(self.cfg, run_dir, self.cfg.trainer.steps, {"after": accuracy["after"]})
                if None not in (accuracy.get("before"), accuracy["after"]):
                    self._say("launcher", f"held-out accuracy: {accuracy['before']:.3f} -> {accuracy['after']:.3f}")
                self._final_interval_eval()
                for line in report_pace(self.cfg, run_dir):
                    self._say("launcher", line)
            elif code == 130:
                self._say("launcher", resume_hint(self.cfg, stop.signal_name))
            self._say("launcher", self._outcome(code, run_dir))
            return code
        finally:
            self._shutdown()

    def _check(self) -> None:
        """Everything that would make the run or its children fail, before anything is written: raises (with a
        message naming the key or path) what cannot be used. Builds the task (reading every data file) and
        every model (once, here, before the children need them)."""
        from drmas.runtime.run_dir import check_output_dir

        cfg = self.cfg
        check_output_dir(cfg.trainer.output_dir, cfg.trainer.resume, cfg.trainer.overwrite)
        self.task = assembly.build_task(cfg)  # reads every data file (cheap, so first): a bad one stops the run here
        for model_id in cfg.models:
            assembly.model_path(cfg, model_id)
        self._check_machine()

    def _claim(self) -> Path:
        """Claim the output directory, place the processes and write the children's config (`config.yaml`, the
        directory's mark as a drmas run); returns the directory."""
        from drmas.runtime.run_dir import claim_output_dir

        cfg = self.cfg
        run_dir = claim_output_dir(cfg.trainer.output_dir, cfg.trainer.resume, cfg.trainer.overwrite)
        self._place()
        self.config_file = run_dir / "config.yaml"
        self.config_file.write_text(to_yaml(self.cfg))
        return run_dir

    def add_rollout(self, index: int) -> Child:
        return self._start(f"rollout-{index}", "rollout", "drmas.rollout.main", ["--index", str(index)])

    def _heldout(self, tag: str, model_dirs=None) -> float | None:
        """Held-out accuracy of the initial models ("before") or the final checkpoints ("after")."""
        if self.cfg.eval.n_problems <= 0:
            return None
        from drmas.evaluation.async_heldout import heldout_of_models

        self._say("launcher", f"held-out evaluation ({tag} training, {self.cfg.eval.n_problems} problems)")
        result = heldout_of_models(self.cfg, tag, model_dirs, self.task)
        if not result:
            return None
        self._say("launcher", f"held-out accuracy {tag} training: {result['accuracy']:.3f}")
        return result["accuracy"]

    def _final_interval_eval(self) -> None:
        """eval.interval: the final version's point of the eval/ curve (rollout 0 stopped before it could)."""
        if not self.cfg.eval.interval:
            return
        from drmas.evaluation.async_heldout import final_interval_eval

        final_interval_eval(self.cfg, self.task, lambda line: self._say("launcher", line))  # it says its summary

    def _watch(self, stop: StopFlag) -> int:
        """Supervise the children until every learner has finished (0), one cannot be recovered (1) or a
        signal arrives (130)."""
        learners = [c for c in self.children if c.role == "learner"]
        while not stop.wait(self.poll_interval_s):
            self._tick()
            now = time.monotonic()
            for child in list(self.children):
                if child.finished or child.retired:
                    continue
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        try:
                            if child.placed():  # else: asked again next round, the others supervised meanwhile
                                self._restart(child)
                        except PlacementError as exc:
                            self._say("launcher", f"{exc}: stopping the run")
                            return 1
                    continue
                rc = child.poll()
                if rc is None:
                    continue
                if child.role == "learner" and rc == 0:
                    child.finished = True
                    continue
                lost = rc == LOST
                decision = self.restarts.after_exit(child.name, None if lost else rc)
                if not decision.restart:
                    self._say("launcher", f"{decision.why}: stopping the run")
                    return 1
                limit = self.cfg.pipeline.restarts.max_restarts
                how = "was lost with its host" if lost else f"exited with code {rc}"
                self._say("launcher", f"{child.name} {how}: restarting it in {decision.delay_s:g} s "
                                      f"(restart {decision.attempt} of {limit})")
                child.restart_at = now + decision.delay_s
            if all(c.finished for c in learners):
                return 0
        self._say("launcher", f"{stop.signal_name or 'stop'} received: stopping every process")
        return 130

    def _outcome(self, code: int, run_dir: Path) -> str:
        if code == 0:
            return f"training finished; metrics, TensorBoard and checkpoints under {run_dir}/<process>/"
        return f"run ended with code {code}; logs of every process above, outputs under {run_dir}/"

    # ---- children ------------------------------------------------------------------------------------
    def _start(self, name: str, role: str, module: str, args: list[str]) -> Child:
        child = self._child(name, role, module, list(args))
        self._spawn(child)
        self.children.append(child)  # only once started: one that could not be placed is not supervised
        return child

    def _restart(self, child: Child) -> None:
        """Start a dead child again; a learner continues from its last checkpoint (and its version)."""
        child.restart_at = None
        if child.role == "learner" and RESUME not in child.args:
            child.args.append(RESUME)
        self._spawn(child)

    def _spawn(self, child: Child) -> None:
        """Start `child`; PlacementError when it cannot be placed."""
        where = child.spawn()
        self._say("launcher", f"started {child.name} (pid {child.pids[-1]}{where})")

    def retire(self, child: Child) -> None:
        """Stop a child for good (a rollout removed from an elastic run)."""
        child.retired = True
        self._stop_group([child])
        child.close()

    def _say(self, name: str, line: str) -> None:
        with self._print_lock:
            self.out.write(f"[{name}] {line}\n")
            self.out.flush()

    def _stop_all(self) -> None:
        for role in STOP_ORDER:
            self._stop_group([c for c in self.children if c.role == role])
        for child in self.children:
            child.close()

    def _stop_group(self, group: list[Child]) -> None:
        running = [c for c in group if c.restart_at is None and c.pids and c.poll() is None]
        for child in running:
            child.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for child in running:
            while child.poll() is None:
                if time.monotonic() > deadline:
                    self._say("launcher", f"{child.name} ignored SIGTERM for {STOP_GRACE_S:g}s: killing it")
                    child.kill()
                    break
                time.sleep(0.05)
