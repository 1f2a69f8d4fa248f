"""Resuming an interrupted `drmas eval` (`eval.resume=true`).

A k=16 evaluation of a multi-turn system takes hours on a CPU, so losing it to a killed process or a
reboot is expensive. Every finished chunk of questions is already in eval_questions.jsonl with its full
episodes; a resumed evaluation loads those questions instead of sampling them again and samples only the
rest. Because every episode draws from its own seeded stream (seed, episode id, turn), the resumed result
equals an uninterrupted one's (up to float rounding of differently composed batches). The same mechanism
extends an evaluation: resume with a larger `eval.max_questions` and only the new questions run.

Resuming is only sound when everything that decides the samples is unchanged, so `eval_run.json` records
those settings when an evaluation starts. The settings also name the evaluation's directory
(`outputs.evaluation_dir`), so a resume with different ones finds none of its own: it is refused, naming the
keys that differ from the evaluation of the same checkpoint found beside it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from drmas.config.schema import DrmasConfig
from drmas.evaluation import kinds, outputs
from drmas.mas.base import EpisodeOutcome

RUN_FILE = "eval_run.json"

# Retrieval settings that do not change which passages a search returns.
_RETRIEVAL_TRANSPORT = frozenset({"timeout_s", "retries", "max_queries_per_request", "index_dir", "batch_size"})


def sample_settings(cfg: DrmasConfig, checkpoint: Optional[Path], model_dirs: dict,
                    sources: Optional[dict] = None) -> dict:
    """Everything that decides which episodes an evaluation samples, as plain JSON values.

    With a checkpoint, `model_checkpoints` records which checkpoint (and step) each model came from: a run
    directory resolves to its newest checkpoints, so resuming after the run saved a newer one is refused
    rather than mixing two checkpoints' samples (`--version N` pins one).

    Left out on purpose: output paths, logging, threads, `eval.max_questions` (a resume may extend the
    question set), and how the retriever is reached or cached (retries, timeouts, request sizes, index
    location), which change how long a search takes but not what it returns.
    """
    def encode(value: object) -> object:
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)

    def plain(value: object) -> object:
        return json.loads(json.dumps(value, default=encode, sort_keys=True))

    settings = {
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "model_dirs": {m: str(p) for m, p in sorted(model_dirs.items())},
        "models": plain({m: cfg.models[m] for m in sorted(cfg.models)}),
        "agents": plain({a: cfg.agents[a] for a in sorted(cfg.agents)}),
        "system": plain(cfg.system),
        "task": plain(cfg.task),
        "retrieval": _without_transport(plain(cfg.retrieval)),
        "invalid_penalty": cfg.algorithm.invalid_penalty,
        "sampling": {**kinds.sampling_record(cfg), "engine": cfg.rollout.engine,
                     "max_batch_size": cfg.rollout.max_batch_size},
        "benchmarks": plain(dict(cfg.eval.benchmarks)),
    }
    if checkpoint is not None and sources is not None:  # (absent without one: eval_run.json files stay comparable)
        settings["model_checkpoints"] = {m: sources[m].record() for m in sorted(sources)}
    return settings


def write_settings(out: Path, settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_FILE).write_text(json.dumps({"settings": settings}, indent=1) + "\n")


def completed_questions(out: Path, settings: dict) -> tuple[list[dict], dict[tuple[str, str], list[EpisodeOutcome]]]:
    """The records of eval_questions.jsonl in `out` that a resume keeps, and their outcomes by (benchmark, uid).

    Nothing to resume (no earlier evaluation in `out`) gives empty results. ValueError when the earlier
    evaluation used other settings (naming them) or its files cannot be read; a torn last line, left by a
    kill in mid-write, is dropped (that question is sampled again).
    """
    run_file, log_file = out / RUN_FILE, out / outputs.QUESTIONS_FILE
    if not out.exists():
        _refuse_other_settings(out, settings)
    if not run_file.exists():
        if log_file.exists() and log_file.stat().st_size > 0:
            raise ValueError(f"eval.resume: {log_file} has no {RUN_FILE} beside it (written by an older drmas?), "
                             "so its settings are unknown; drop eval.resume to start a new evaluation")
        return [], {}
    _refuse_changed(out, _recorded_settings(run_file), settings)
    records, done = [], {}
    if log_file.exists():
        lines = log_file.read_text().splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                outcomes = [outputs.outcome_from_record(e) for e in record["episodes"]]
                key = (record["benchmark"], record["uid"])
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):
                    break  # the line being written when the evaluation was killed
                raise ValueError(f"eval.resume: {log_file}:{number}: not a question record ({exc})") from None
            if len(outcomes) == settings["sampling"]["k"] and key not in done:
                records.append(record)
                done[key] = outcomes
    return records, done


def _refuse_changed(out: Path, previous: dict, settings: dict) -> None:
    changed = sorted(_changed_keys(previous, settings))
    if changed:
        raise ValueError(f"eval.resume: the evaluation in {out} used other settings ({', '.join(changed)}); "
                         "resume with the same ones, or drop eval.resume to start a new evaluation (it gets a "
                         "directory of its own)")


def _refuse_other_settings(out: Path, settings: dict) -> None:
    """No evaluation with these settings yet: if one of the same `--checkpoint` exists beside it (the newest),
    the resume was meant for that one, with settings changed since (or a run directory whose newest
    checkpoint changed): refuse, naming what differs."""
    earlier = []
    for run_file in out.parent.glob(f"*/{RUN_FILE}"):
        recorded = _recorded_settings(run_file)
        if recorded.get("checkpoint") == settings["checkpoint"]:
            earlier.append((run_file.stat().st_mtime, run_file.parent, recorded))
    if earlier:
        _, where, recorded = max(earlier, key=lambda item: item[0])
        _refuse_changed(where, recorded, settings)


def _recorded_settings(run_file: Path) -> dict:
    """The settings an evaluation recorded when it started (ValueError when the file cannot be read)."""
    try:
        previous = json.loads(run_file.read_text())["settings"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"eval.resume: {run_file} is not readable: {exc}") from None
    if isinstance(previous, dict) and isinstance(previous.get("retrieval"), dict):
        previous["retrieval"] = _without_transport(previous["retrieval"])  # eval_run.json files that recorded them
    return previous


def _without_transport(retrieval: dict) -> dict:
    return {key: value for key, value in retrieval.items() if key not in _RETRIEVAL_TRANSPORT}


def _changed_keys(old: object, new: object, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = set(old) | set(new)
        return [k for key in sorted(keys) for k in _changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]
