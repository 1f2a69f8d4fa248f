"""Claiming an output directory for a run: never append to, or silently overwrite, someone else's run.

Metrics are appended (`metrics.jsonl`, TensorBoard event files) and checkpoints are written by step number,
so a second run into the same directory used to mix two runs' curves and replace the first run's
checkpoints without a word. A run therefore starts only in an empty (or new) directory, unless it resumes
the run that is there (`trainer.resume=true`) or is told to replace it (`trainer.overwrite=true`). Replacing
deletes only a directory that looks like a drmas run (it holds a `config.yaml`), so a mistyped output_dir
pointing at a home directory is refused rather than emptied. Evaluations (`evals/`, written by `drmas eval`,
e.g. of the initial models before training) do not count as a run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

RUN_MARKER = "config.yaml"  # every drmas run (colocated, async, each pipeline process) writes one
EVALS_DIR = "evals"  # `drmas eval` results (drmas.evaluation.outputs): no obstacle to a run starting here


class OutputDirError(ValueError):
    """The output directory holds another run and the config says neither resume nor overwrite."""


def check_output_dir(path: str | Path, resume: bool, overwrite: bool, key: str = "trainer.output_dir") -> Path:
    """Whether `path` may take a run (see `claim_output_dir`), without changing anything: OutputDirError if
    not. A launcher asks this first and claims the directory only once every other check has passed, so a
    run refused for another reason leaves nothing behind that would refuse the corrected command."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{key}={out} is a file, not a directory")
    entries = sorted(p.name for p in out.iterdir() if p.name != EVALS_DIR) if out.is_dir() else []
    if entries and not resume:
        if not overwrite:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise OutputDirError(
                f"{key}={out} already holds a run ({shown}): pass trainer.resume=true to continue it, "
                f"trainer.overwrite=true to replace it, or another {key}"
            )
        if not (out / RUN_MARKER).is_file():
            raise OutputDirError(
                f"{key}={out} is not empty and holds no {RUN_MARKER}, so it does not look like a drmas run: "
                "refusing to delete it for trainer.overwrite=true; choose an empty or new directory"
            )
    return out


def claim_output_dir(path: str | Path, resume: bool, overwrite: bool, key: str = "trainer.output_dir") -> Path:
    """Make `path` ready for a run: created if missing; refused if it holds anything, unless resuming, or
    emptied first when `overwrite` and it is a drmas run directory. Returns the path."""
    out = check_output_dir(path, resume, overwrite, key)
    if (out / RUN_MARKER).is_file() and not resume:  # overwrite (checked above): replace the old run
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out
