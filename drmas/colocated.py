"""Colocated training: rollout, advantages, one update per model and the weight push, in one process.

It wires the same components the asynchronous pipeline uses (episode runner, agent-wise advantages,
per-model PolicyTrainer, engine.load_weights) so the two modes differ only in transport. The engine keeps
its own copy of each model and receives the trainer's weights after every update, exactly as a remote
rollout engine would. The adapters of a model with LoRA adapters are trained over one shared frozen copy of
its base (a trainer and an optimizer per adapter) and pushed into the one engine serving them all.

A signal (Ctrl-C, SIGTERM) stops the run as it stops a pipeline process (`drmas.runtime.process.StopFlag`):
the step in progress is abandoned at its next safe point (between engine steps of its rollout, or between
forward passes before its first optimizer step; as if it had never started: its problems and the running
statistics are given back) or, past that point, finished; then the run saves its checkpoint, says where and
exits 0. A checkpoint being written when the signal comes is finished first. A second signal stops at once.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from drmas import assembly
from drmas.config.load import to_yaml
from drmas.config.schema import DrmasConfig
from drmas.core.sample import Sample
from drmas.evaluation import kinds
from drmas.evaluation.evals_log import EvalLog
from drmas.evaluation.heldout import accuracy_scalars
from drmas.evaluation.interval import IntervalEvaluations
from drmas.algorithms.estimators import AdvantageBatch, estimate
from drmas.learner.policy import PolicyTrainer, UpdateStopped
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.learner.trainers import adapter_trainers
from drmas.learner.scalars import agent_reward_stats, agent_scalars, reward_stats_scalars
from drmas.models import checkpoint
from drmas.models.devices import resolve_device
from drmas.episodes import EpisodeRequest, EpisodeTally
from drmas.runtime.metrics import PROMPTS_FILE, MetricsWriter, StepRecords, agent_line, spike_summary
from drmas.runtime.process import StopFlag, progress_bars_on
from drmas.runtime.run_dir import check_output_dir, claim_output_dir


class StepAbandoned(Exception):
    """A signal came before the step (or the held-out evaluation) in progress reached a point of no return."""


class ColocatedRun:
    def __init__(self, cfg: DrmasConfig, log=print) -> None:
        self.cfg = cfg
        self.log = log
        check_output_dir(cfg.trainer.output_dir, cfg.trainer.resume, cfg.trainer.overwrite)  # claimed once all else is
        assembly.require_packages(cfg)
        if cfg.trainer.threads > 0:
            torch.set_num_threads(cfg.trainer.threads)
        checkpoint.seed_everything(cfg.trainer.seed)
        self.task = assembly.build_task(cfg)
        self.orchestra = assembly.build_orchestra(cfg, self.task)
        self.sampler = assembly.drawing_order(cfg, self.task)
        assembly.check_drawing_order(cfg, cfg.trainer.output_dir, self.sampler)
        self.stats = AgentRewardStats(window=cfg.algorithm.running_stats_window)
        self.engines, self.trainers, self.tokenizers = {}, {}, {}
        self._build_models()
        self.stop: StopFlag | None = None  # set while `run` runs: the signals' flag
        self.runner = assembly.episode_runner(cfg, self.orchestra, self.engines, assembly.agent_specs(cfg),
                                              on_round=self._between_rounds)
        self.eval_runner = assembly.episode_runner(cfg, self.orchestra, self.engines,
                                                   assembly.agent_specs(cfg, temperature=cfg.eval.temperature),
                                                   on_round=self._between_rounds)
        # eval.interval: its questions are read (and a bad benchmark file refused) before the directory is claimed
        self.interval_benchmarks = kinds.load_benchmarks(cfg, self.task) if cfg.eval.interval else {}
        # built and checked (data files, models, devices): only now is the directory claimed, so a refused run
        # leaves nothing that would refuse the corrected command (nor deleted the old run for trainer.overwrite)
        self.out = claim_output_dir(cfg.trainer.output_dir, cfg.trainer.resume, cfg.trainer.overwrite)
        self.step = 0
        self.saved_step: int | None = None  # step of the newest checkpoint written or resumed from
        self.history: dict[str, list[float]] = defaultdict(list)
        self.accuracy: dict[str, float] = {}
        self.heldout: dict[str, dict[str, float]] = {}  # tag -> the whole held-out report (valid/*, info/*)

    def _build_models(self) -> None:
        from drmas.models.loading import compute_dtype, load_model, torch_dtype

        cfg = self.cfg
        self.engines = assembly.build_engines(cfg, cfg.trainer.seed)
        trained = assembly.trained_models(cfg)
        for base, mcfg in cfg.models.items():
            ids = [m for m in trained if assembly.split_model(m)[0] == base]
            if not ids:
                continue
            device = resolve_device(mcfg.device, f"models.{base}.device")
            if mcfg.adapters:  # one frozen base, a trainer per adapter; the engine starts on their weights
                trainers, tokenizer = adapter_trainers(cfg, ids, device)
                for trainer in trainers:
                    self.trainers[trainer.model_id], self.tokenizers[trainer.model_id] = trainer, tokenizer
                    assembly.weight_target(self.engines, trainer.model_id).load_weights(trainer.named_tensors(), 0)
                continue
            model, tokenizer = load_model(assembly.model_path(cfg, base), dtype=mcfg.dtype, device=device)
            weights = {n: cfg.agents[n].loss_weight for n in assembly.trained_agents(cfg, base)}
            self.trainers[base] = PolicyTrainer(base, model, mcfg.optim, cfg.algorithm, weights,
                                                compute_dtype=torch_dtype(compute_dtype(mcfg, device)),
                                                activation_checkpointing=mcfg.activation_checkpointing)
            self.tokenizers[base] = tokenizer

    # ---- checkpoints -------------------------------------------------------------------------------
    def save(self) -> Path:
        models = {m: (t.saveable(t.weight_source(), self.tokenizers[m]), self.tokenizers[m])
                  for m, t in self.trainers.items()}
        states = {m: t.state_dict() for m, t in self.trainers.items()}
        run_state = {"step": self.step, "stats": self.stats.state_dict(), "sampler": self.sampler.state_dict(),
                     "order": self.sampler.fingerprint(),
                     "accuracy": self.accuracy, "history": self.history}
        path = checkpoint.save_checkpoint(self.out, self.step, models, states, run_state,
                                          keep=self.cfg.trainer.keep_checkpoints)
        self.saved_step = self.step
        return path

    def resume(self) -> bool:
        self.log(checkpoint.resume_line(self.out))  # which checkpoint, which torn ones are skipped, or none
        ckpt = checkpoint.latest_checkpoint(self.out)
        if ckpt is None:
            return False
        for model_id, trainer in self.trainers.items():
            checkpoint.load_trainer(ckpt, model_id, trainer)
        state = checkpoint.load_run_state(ckpt)
        self.step = self.saved_step = int(state["step"])
        self.stats.load_state_dict(state["stats"])
        self.sampler.load_state_dict(state["sampler"])
        self.accuracy = state.get("accuracy", {})
        self.history = defaultdict(list, state.get("history", {}))
        self._push_weights(version=self.step)
        self.log(f"resumed from {ckpt} at step {self.step}")
        return True

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train to `trainer.steps` (or until a signal); returns the summary (`stopped`: the signal's name)."""
        self.stop = StopFlag()
        try:
            return self._run()
        finally:
            self.stop.restore()
            assembly.close_orchestra(self.orchestra)  # the external system's gateway and program stop here

    def _run(self) -> dict:
        cfg = self.cfg
        (self.out / "config.yaml").write_text(to_yaml(cfg))
        resumed = cfg.trainer.resume and self.resume()
        # a resumed run logs the steps after its checkpoint again: never twice (see MetricsWriter)
        resumed_at = self.step if cfg.trainer.resume else None
        writer = MetricsWriter(self.out, tensorboard=cfg.logging.tensorboard, resumed_at=resumed_at)
        self.prompts = StepRecords(self.out / PROMPTS_FILE, resumed_at=resumed_at)
        evals = EvalLog(self.out, tensorboard=cfg.logging.tensorboard, resumed_at=resumed_at, metrics=writer)
        intervals = IntervalEvaluations(cfg, self.interval_benchmarks, evals, self.orchestra.agents, self.log)
        try:
            if not resumed and (before := self._heldout("before", writer)):
                self.log(f"held-out accuracy before training: {before['accuracy']:.3f} ({before['n']:.0f} problems)")
            self._evaluate_if_due(intervals)
            self._train(writer, lambda: self._evaluate_if_due(intervals))
            if not self.stop.is_set():
                self._heldout("after", writer)
        except StepAbandoned:
            pass  # a signal: the held-out evaluation in progress is dropped, the run saves below
        writer.close()
        self.prompts.close()
        evals.close()
        if self.trainers and self.saved_step != self.step and self.step > 0:
            self.save()
        if self.stop.is_set():
            self.log(self._stopped_line())
        return self.summary()

    def _train(self, writer: MetricsWriter, between_steps) -> None:
        cfg = self.cfg
        bar = _progress(cfg, initial=self.step)
        try:
            while self.step < cfg.trainer.steps and not self.stop.is_set():
                try:
                    scalars, hists = self.train_step()
                except StepAbandoned:
                    break
                self.step += 1
                writer.log(self.step, scalars, hists)
                self.prompts.write({"step": self.step, **self._drawn})
                if cfg.logging.console_every and self.step % cfg.logging.console_every == 0:
                    speaking = [n for n, a in cfg.agents.items() if a.model]  # scripted agents make no samples
                    self.log(agent_line(self.step, scalars, speaking, list(self.trainers)))
                if cfg.trainer.checkpoint_interval and self.step % cfg.trainer.checkpoint_interval == 0:
                    self.save()
                bar.update(1)
                between_steps()
        finally:
            bar.close()

    def _heldout(self, tag: str, writer: MetricsWriter) -> dict[str, float]:
        """Held-out accuracy `tag` of the weights the engines hold, logged at this step ({}: no problems)."""
        result = kinds.heldout(self.cfg, self.task, tag).run(self.eval_runner)
        if result:
            self.accuracy[tag] = result["accuracy"]
            self.heldout[tag] = result
            writer.log(self.step, accuracy_scalars({tag: result["accuracy"]}))
        return result

    def _evaluate_if_due(self, intervals: IntervalEvaluations) -> None:
        """eval.interval: evaluate the weights of this step (the engines hold them since the step's push)."""
        evaluation = intervals.due(self.step)
        if evaluation is not None:
            evaluation.run(self.eval_runner)  # its sink writes and logs the report

    def _stopped_line(self) -> str:
        how = f"stopped by {self.stop.signal_name or 'request'} at step {self.step} of {self.cfg.trainer.steps}"
        if not self.trainers or self.saved_step is None:
            return f"{how}: nothing trained, nothing saved"
        return (f"{how}: checkpoint {checkpoint.checkpoint_dir(self.out, self.saved_step)} saved; continue with "
                f"trainer.resume=true")

    def _between_rounds(self) -> None:
        """The episode runners' hook between engine steps: where a signal abandons the rollout in progress."""
        if self.stop is not None and self.stop.is_set():
            raise StepAbandoned

    def train_step(self) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """One step: rollout, advantages, one update per model, weights into the engines. StepAbandoned when a
        signal came before the first model's optimizer step: nothing of the step is kept (its problems go back
        to the sampler, the running statistics are as before), so a resume does the same step again."""
        sampler, stats = self.sampler.state_dict(), self.stats.state_dict()
        try:
            return self._train_step()
        except (StepAbandoned, UpdateStopped):
            self.sampler.load_state_dict(sampler)
            self.stats.load_state_dict(stats)
            raise StepAbandoned from None

    def _advantages(self, samples: list[Sample]) -> np.ndarray:
        """Each trained model's samples estimated as its async learner would estimate them (their groups' other
        calls as context: frozen agents', other models'); nan for the samples no model trains. The running
        statistics take the step's rewards after every model's estimate."""
        adv = np.full(len(samples), np.nan)
        for model_id in self.trainers:
            agents = set(assembly.trained_agents(self.cfg, model_id))
            idx = [i for i, s in enumerate(samples) if s.agent in agents]
            if idx:
                batch = AdvantageBatch.from_samples([samples[i] for i in idx], samples)
                adv[idx] = estimate(batch, self.cfg.algorithm, self.stats)
        self.stats.update([s.agent for s in samples], [s.reward for s in samples])
        return adv

    def _train_step(self) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        cfg, t0 = self.cfg, time.perf_counter()
        first = self.sampler.drawn
        problems = self.sampler.next(cfg.rollout.prompts_per_step)
        self._drawn = {"draws": list(range(first, first + len(problems))), "prompts": [p.uid for p in problems]}
        requests = [
            EpisodeRequest(f"s{self.step}-g{gi}-e{ei}", f"s{self.step}-g{gi}", problem)
            for gi, problem in enumerate(problems)
            for ei in range(cfg.rollout.group_size)
        ]
        results = self.runner.run(requests)
        dropped = {r.request.group_id for r in results if r.outcome.dropped}  # incomplete groups train nothing
        samples: list[Sample] = [s for r in results if r.request.group_id not in dropped for s in r.samples]
        t_rollout = time.perf_counter() - t0
        adv = self._advantages(samples)
        scalars = agent_scalars(samples, adv)
        scalars.update(reward_stats_scalars(self.stats))
        tally = EpisodeTally()
        for result in results:
            tally.add(result.outcome)
        scalars.update(tally.scalars())  # episode/reward_mean, episode/info/<key>
        scalars.update(self.runner.failure_scalars())  # a plugin raised or ran past a bound: see EpisodeRunner
        scalars["rollout/groups_dropped"] = float(len(dropped))
        committed = False  # once a model has taken its optimizer step, the step is finished, not abandoned
        for model_id, trainer in self.trainers.items():
            agents_of_model = set(assembly.trained_agents(cfg, model_id))
            idx = [i for i, s in enumerate(samples) if s.agent in agents_of_model]
            update = trainer.update([samples[i] for i in idx], adv[idx],
                                    should_stop=None if committed else self.stop.is_set)
            committed = committed or bool(update)
            scalars.update(update)
        t_push = time.perf_counter()
        self._push_weights(version=self.step + 1)
        scalars["weight_sync/seconds"] = time.perf_counter() - t_push
        elapsed = time.perf_counter() - t0
        scalars.update({"time/step_seconds": elapsed, "time/rollout_seconds": t_rollout,
                        "throughput/samples_per_s": len(samples) / elapsed,
                        "throughput/rollout/tokens_per_s": sum(len(s.response_ids) for s in samples) / max(t_rollout, 1e-9)})
        for key, value in scalars.items():
            if key.startswith(("grad_norm/", "advantage/")):
                self.history[key].append(value)
        return scalars, {}

    def _push_weights(self, version: int) -> None:
        """Copy every trained model's weights into its engine; `version` stamps the tokens generated next."""
        for model_id, trainer in self.trainers.items():
            assembly.weight_target(self.engines, model_id).load_weights(trainer.named_tensors(), version=version)

    def summary(self) -> dict:
        out = {"steps": self.step, "accuracy": dict(self.accuracy), "heldout": dict(self.heldout),
               "reward_stats": agent_reward_stats(self.stats)}
        if self.stop is not None and self.stop.is_set():
            out["stopped"] = self.stop.signal_name or "request"
        for key, values in self.history.items():
            if key in {f"grad_norm/{m}" for m in self.trainers}:
                out[key] = spike_summary(values)
            elif key.endswith("/sq_mean"):
                out[key] = float(np.mean(values))
        return out


def _progress(cfg: DrmasConfig, initial: int):
    from tqdm import tqdm

    return tqdm(total=cfg.trainer.steps, initial=initial, desc="train", unit="step",
                disable=not progress_bars_on(cfg.logging.progress_bar), leave=False)
