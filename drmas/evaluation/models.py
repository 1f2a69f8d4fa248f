"""Which model directory `drmas eval` serves for each configured model, and which checkpoint it came from.

`--checkpoint` takes either one checkpoint or a whole run directory:

- a checkpoint (`<run>/checkpoints/step_<N>/` of a colocated run, or one learner's
  `<run>/learner-<m>/checkpoints/step_<N>/`) holds one Hugging Face directory per model it saved;
- a run directory (`<run>/`, colocated or async) is searched per trained model: an async run keeps each
  model's checkpoints under `learner-<m>/checkpoints/`, numbered by that learner's version, a colocated run
  keeps all models' under `checkpoints/`. Each model gets its newest *complete* checkpoint (`COMPLETE`
  marker written last), or the one of `--version N`.

Frozen models (and trainable ones no agent trains) are never saved in checkpoints, because they never
change, so they come from their config; so does the frozen base of a model with LoRA adapters, whose
checkpoints hold each adapter (`<m>/<adapter>/`, peft's format) and never the base. A trained model without a checkpoint is an error: silently
evaluating its initial weights would report the untrained system under the checkpoint's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig

_STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"


@dataclass(frozen=True)
class ModelSource:
    """Where one evaluated model's weights come from: a checkpoint's model directory, or its config."""

    path: Path
    checkpoint: Optional[Path] = None  # the step directory; None when the weights are the config's
    step: Optional[int] = None  # that checkpoint's step (a learner's version in an async run)

    def record(self) -> Optional[dict]:
        """The JSON provenance written to eval.json / eval_run.json (None: the config's weights)."""
        if self.checkpoint is None:
            return None
        return {"checkpoint": str(self.checkpoint), "step": self.step}


def checkpoint_step(checkpoint: Optional[Path]) -> int:
    """The training step of a checkpoint directory (`step_<N>`, else its COMPLETE marker), 0 for none."""
    if checkpoint is None:
        return 0
    match = _STEP_DIR.match(checkpoint.name)
    if match:
        return int(match.group(1))
    marker = checkpoint / COMPLETE
    if marker.is_file() and marker.read_text().strip().isdigit():
        return int(marker.read_text().strip())
    return 0


def check_checkpoint_dir(checkpoint: Path) -> None:
    """FileNotFoundError when `checkpoint` is not a directory; ValueError for a run checkpoint whose save
    was interrupted (trainer state present but no COMPLETE marker: its weights may be torn)."""
    if not checkpoint.is_dir():
        raise FileNotFoundError(
            f"checkpoint directory {str(checkpoint)!r} does not exist (expected a run directory or one of its "
            "checkpoints/step_<N> or learner-<model>/checkpoints/step_<N> directories)"
        )
    if (checkpoint / "trainer_state").is_dir() and not (checkpoint / COMPLETE).exists():
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} has no COMPLETE marker: its save was interrupted; "
            "evaluate an earlier complete checkpoint"
        )


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a run's output directory rather than one checkpoint of it.

    A checkpoint is recognised first (its `step_<N>` name, COMPLETE marker or trainer state), so a
    directory that looks like both is taken for the checkpoint, as before run directories were accepted.
    """
    if _STEP_DIR.match(path.name) or (path / COMPLETE).exists() or (path / "trainer_state").is_dir():
        return False
    return ((path / "checkpoints").is_dir() or (path / "config.yaml").is_file()
            or any(child.is_dir() for child in path.glob("learner-*")))


def model_sources(cfg: DrmasConfig, checkpoint: Optional[Path], version: Optional[int] = None
                  ) -> dict[str, ModelSource]:
    """Model id -> where `drmas eval` takes it from, for no checkpoint, a checkpoint or a run directory.

    `version` picks that checkpoint of each trained model of a run directory (only valid with one).
    Raises FileNotFoundError / ValueError naming the path, the model and what exists.
    """
    if checkpoint is None:
        if version is not None:
            raise ValueError(f"--version {version} picks a checkpoint of a run: it needs --checkpoint RUN_DIR")
        return {model_id: ModelSource(assembly.model_path(cfg, model_id)) for model_id in cfg.models}  # adapters: init
    check_checkpoint_dir(checkpoint)
    if is_run_dir(checkpoint):
        return _run_dir_sources(cfg, checkpoint, version)
    if version is not None:
        raise ValueError(
            f"--version {version} picks a checkpoint of a run directory, but {str(checkpoint)!r} is one checkpoint "
            f"(step {checkpoint_step(checkpoint)}); pass the run directory, or drop --version"
        )
    return _checkpoint_sources(cfg, checkpoint)


def _checkpoint_sources(cfg: DrmasConfig, checkpoint: Path) -> dict[str, ModelSource]:
    """Sources for one checkpoint directory: its model directories, the config for models it cannot hold."""
    trained = set(assembly.trained_models(cfg))
    step = checkpoint_step(checkpoint)
    sources = _bases(cfg)
    for model_id in assembly.model_ids(cfg):
        saved = checkpoint / model_id
        if saved.is_dir():
            sources[model_id] = ModelSource(_saved_model_dir(saved), checkpoint, step)
        elif model_id in trained:
            raise FileNotFoundError(
                f"checkpoint {str(checkpoint)!r} has no directory for trained model {model_id!r} "
                f"(expected {str(saved)!r}); is it a checkpoint of a run of this config? (an async run's "
                "learner-<model>/checkpoints/step_<N> holds that model only: pass the run directory instead)"
            )
        elif assembly.split_model(model_id)[1] is None:  # frozen, or trained by no agent: its config weights
            sources[model_id] = ModelSource(assembly.model_path(cfg, model_id))
    return sources


def _bases(cfg: DrmasConfig) -> dict[str, ModelSource]:
    """The frozen bases of models with adapters, from their config (checkpoints hold only the adapters)."""
    return {m: ModelSource(assembly.model_path(cfg, m)) for m, mcfg in cfg.models.items() if mcfg.adapters}


def _run_dir_sources(cfg: DrmasConfig, run: Path, version: Optional[int]) -> dict[str, ModelSource]:
    """Sources for a run directory: each trained model's newest complete checkpoint (or `version`'s)."""
    trained = set(assembly.trained_models(cfg))
    sources = _bases(cfg)
    for model_id in assembly.model_ids(cfg):
        if model_id in trained:
            step, step_dir = _pick_checkpoint(run, model_id, version)
            sources[model_id] = ModelSource(_saved_model_dir(step_dir / model_id), step_dir, step)
        elif assembly.split_model(model_id)[1] is None:  # an adapter no agent trains: as initialised
            sources[model_id] = ModelSource(assembly.model_path(cfg, model_id))
    return sources


def _checkpoint_roots(run: Path, model_id: str) -> list[Path]:
    """Where a run keeps `model_id`'s checkpoints: its learner's directory (async), then the run's (colocated)."""
    return [run / f"learner-{model_id}" / "checkpoints", run / "checkpoints"]


def _complete_checkpoints(root: Path, model_id: str) -> dict[int, Path]:
    """Step -> `step_<N>` directory of every complete checkpoint under `root` that holds `model_id`."""
    found: dict[int, Path] = {}
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / COMPLETE).exists() and (child / model_id).is_dir():
                found[int(match.group(1))] = child
    return found


def _pick_checkpoint(run: Path, model_id: str, version: Optional[int]) -> tuple[int, Path]:
    """`(step, step directory)` of `model_id` in `run`: `version`'s, else the newest complete one."""
    roots = _checkpoint_roots(run, model_id)
    for root in roots:
        complete = _complete_checkpoints(root, model_id)
        if not complete:
            continue
        if version is None:
            newest = max(complete)
            return newest, complete[newest]
        if version not in complete:
            raise ValueError(
                f"--version {version}: trained model {model_id!r} has no complete checkpoint step_{version} in "
                f"{str(root)!r}; complete ones there: {', '.join(f'step_{s}' for s in sorted(complete))}"
            )
        return version, complete[version]
    raise FileNotFoundError(
        f"run directory {str(run)!r} has no complete checkpoint of trained model {model_id!r} (looked in "
        f"{' and '.join(repr(str(root)) for root in roots)}: a step_<N>/{model_id} directory with a COMPLETE "
        "marker beside it); let the run save one (trainer.checkpoint_interval), or drop --checkpoint to "
        "evaluate the config's initial models"
    )


def _saved_model_dir(saved: Path) -> Path:
    """A checkpoint's model directory, if it is a Hugging Face directory (or an adapter's peft directory)."""
    if (saved / "adapter_config.json").is_file():
        return saved
    if not (saved / "config.json").is_file():
        raise FileNotFoundError(
            f"checkpoint model directory {str(saved)!r} has no config.json (not a Hugging Face model directory)"
        )
    return saved
