"""A learner process: the lanes of the models it trains, and the loop that feeds them their batches.

A process trains one model (`drmas-learner --model ID`), or every trained adapter of one base over one copy of
the frozen base (`--model <base>`, the default layout of a model with adapters, `drmas.config.derived
.learner_processes`): one `ModelLane` per model id, each with everything that makes an adapter behave as a model
(its collector and staleness bound, optimizer, version, push, statistics, checkpoints, resume; see
`drmas.learner.lane`). The lanes share the process, its one thread and its base: their updates run in turn, as
their batches become whole. With one lane the loop waits for each batch; with several it polls every lane (a
pull of at most `POLL_MS` / lanes each), so a lane whose groups are late never holds back one whose groups are
there. Adapters are not mixed in one forward pass: each has its own optimizer, version and staleness bound,
so its batch is its own step (docs/lora.md has the measurements).

When a lane reaches `trainer.steps` it saves and tells the buffer it finished (admission stops waiting for it:
a peer learner that restarted behind it still gets groups); the process ends when every lane has.

A stop signal (SIGTERM from a launcher, Ctrl-C by hand) ends the loop at the next safe point: while it waits
for a batch, or during an update before the update's first optimizer step (the batch is abandoned, its
groups untrained), never after a whole extra update; then every lane saves its version and the process exits 0.

The process's log is `<output_dir>/learner-<process id>/process.log`; everything a lane writes lives in
`<output_dir>/learner-<model id>/`, so learners of different models never share a file and a restarted
learner resumes every lane from its own state.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.learner.lane import ModelLane
from drmas.learner.policy import UpdateStopped
from drmas.learner.ranks.group import BatchFanout, learner_ranks
from drmas.learner.trainers import learner_trainers
from drmas.models import checkpoint
from drmas.runtime.process import StopFlag, add_log_file
from drmas.runtime.run_dir import claim_output_dir

log = logging.getLogger(__name__)

POLL_MS = 200  # with several lanes: one round of pulls over all of them waits at most this long


def models_of(cfg: DrmasConfig, process_id: str) -> list[str]:
    """The model ids the learner process `process_id` trains: a process of `learner_processes`, or any one
    trained model id (an adapter alone, as with `learner_per_adapter`)."""
    processes = assembly.learner_processes(cfg)
    if process_id in processes:
        return processes[process_id]
    if process_id in assembly.trained_models(cfg):
        return [process_id]
    raise ValueError(f"model {process_id!r} is not trained by any agent (learner processes: "
                     f"{', '.join(processes) or 'none'}; trained models: {', '.join(assembly.trained_models(cfg))})")


class LearnerWorker:
    def __init__(self, cfg: DrmasConfig, process_id: str, stop: StopFlag) -> None:
        self.cfg, self.process_id, self.stop = cfg, process_id, stop
        model_ids = models_of(cfg, process_id)
        mcfg = assembly.model_config(cfg, model_ids[0])
        ranks, self.device = learner_ranks(mcfg.device, mcfg.ranks, process_id, mcfg.collective_timeout_s)
        out = Path(cfg.trainer.output_dir)
        for model_id in model_ids:
            claim_output_dir(out / f"learner-{model_id}", cfg.trainer.resume, cfg.trainer.overwrite)
        add_log_file(out / f"learner-{process_id}")
        order = assembly.drawing_order(cfg)
        for model_id in model_ids:
            assembly.check_drawing_order(cfg, out / f"learner-{model_id}", order)
        if cfg.trainer.threads > 0:
            torch.set_num_threads(cfg.trainer.threads)
        checkpoint.seed_everything(cfg.trainer.seed)
        trainers, tokenizer = learner_trainers(cfg, model_ids, ranks, self.device)
        self.fanout = BatchFanout(ranks)  # the other ranks' batches (none with one rank)
        self.lanes = [ModelLane(cfg, m, t, tokenizer, self.fanout, stop, order.fingerprint(), self.device)
                      for m, t in zip(model_ids, trainers)]

    @property
    def version(self) -> int:
        """The lowest version of the lanes (the one version of a one-model learner)."""
        return min(lane.version for lane in self.lanes)

    def run(self) -> int:
        """Train until every lane reached `trainer.steps` versions (or a stop signal); returns the lowest version
        reached."""
        opened: list[ModelLane] = []
        try:
            for lane in self.lanes:
                lane.open()
                opened.append(lane)
            if len(self.lanes) == 1:
                self._run_one(self.lanes[0])
            else:
                self._run_lanes()
            for lane in self.lanes:
                lane.finish()
            self.fanout.finish()  # not on an exception: the other ranks may be inside a collective; torchrun ends them
        finally:
            for lane in opened:
                lane.close()
        return self.version

    def _run_one(self, lane: ModelLane) -> None:
        while not lane.done and not self.stop.is_set():
            batch = lane.next_batch()
            if batch is None or not self._train(lane, batch):
                break

    def _run_lanes(self) -> None:
        wait_ms = max(POLL_MS // len(self.lanes), 10)
        while not self.stop.is_set():
            running = [lane for lane in self.lanes if not lane.done]
            if not running:
                return
            for lane in running:
                batch = lane.poll(wait_ms)
                if batch is not None and not self._train(lane, batch):
                    return
                if lane.done:
                    lane.finish()  # saved, and the buffer stops waiting for it while the others train on
                if self.stop.is_set():
                    return

    def _train(self, lane: ModelLane, batch) -> bool:
        """`lane.train(batch)`; False when the update was abandoned for a stop signal."""
        try:
            lane.train(batch)
        except UpdateStopped:
            log.info("stopped by %s during the update of %r from version %d: the update is abandoned (its %d "
                     "samples are not trained); saving version %d", self.stop.signal_name or "request",
                     lane.model_id, lane.version, len(batch.samples), lane.version)
            return False
        return True
