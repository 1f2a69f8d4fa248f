"""What makes a directory a model drmas can use, and finding one by model id in the local Hugging Face cache.

Transformers reports a broken model directory (config.json that is not JSON, torn or missing weights, no
tokenizer) with a deep traceback that names neither the file nor the config key to fix, and a model id it
cannot download (training machines are offline) fails the same way. Everything here is checked before
transformers reads the directory, so a mistake ends the run at once with one line naming the key
(`models.<id>.path`) and the file at fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def resolve_path_or_id(value: str, key: str) -> Path:
    """A checked model directory for ``value``: a local path when one exists there, else a Hugging Face model
    id looked up in the local HF cache. A local path always wins, so a directory named like an id is used."""
    local = Path(value).expanduser()
    if local.exists() or not looks_like_model_id(value):
        return checked_model_dir(local, key)
    return checked_model_dir(cached_snapshot(value, key), key)


def looks_like_model_id(value: str) -> bool:
    """Whether ``value`` could be a hub model id (``org/name`` or ``name``) rather than only a path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if value.startswith((".", "/", "~")) or "\\" in value or value.count("/") > 1:
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory, read from the environment now.

    huggingface_hub reads HF_HUB_CACHE / HF_HOME once, when it is imported; reading them here means a cache
    chosen later in the process (a launcher, a test) is the one searched and named in errors.
    """
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def cached_snapshot(model_id: str, key: str) -> Path:
    """The snapshot directory of ``model_id`` (its ``main`` revision) in the local HF cache; never downloads.

    FileNotFoundError names the key, the id and the cache searched, and how to get the model there.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hf_hub_cache()
    try:
        return Path(snapshot_download(model_id, cache_dir=str(cache), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError):
        folder = "models--" + model_id.replace("/", "--")
        raise FileNotFoundError(
            f"{key}: {model_id!r} is not a local directory, and as a Hugging Face model id it is not in the "
            f"local HF cache {str(cache)!r} (drmas never downloads). Download it on a machine with network "
            f"access (`hf download {model_id}`) and copy its cache folder {folder} into {str(cache)!r} (or set "
            f"HF_HUB_CACHE to a copied cache), or set {key} to a local model directory"
        ) from None


def checked_model_dir(path: Path, key: str) -> Path:
    """``path`` if it is a loadable HF causal-LM directory, else an error naming the file at fault and ``key``.

    Checked here, before transformers reads the directory, because transformers reports a broken config or
    torn weights with a deep traceback that names neither the file nor the config key to fix.
    """
    if not path.is_dir():
        raise FileNotFoundError(f"{key}: model directory {str(path)!r} does not exist")
    _check_causal_lm_config(path, key)
    for weights in _weight_files(path, key):
        _check_weight_file(weights, key)
    _check_tokenizer_files(path, key)
    return path


def _read_json_object(file: Path, key: str) -> dict:
    """The JSON object in ``file``; ValueError naming the file, the key and the parse error otherwise."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{key}: {str(file)!r} is not valid JSON ({exc}); the model directory is corrupt") from None
    if not isinstance(data, dict):
        raise ValueError(f"{key}: {str(file)!r} holds a JSON {type(data).__name__}, not an object")
    return data


def _check_causal_lm_config(path: Path, key: str) -> None:
    """config.json exists, is a JSON object with a ``model_type`` transformers knows, of a causal LM."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{key}: {str(path)!r} has no config.json (not a Hugging Face model directory)")
    data = _read_json_object(file, key)
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise ValueError(f"{key}: {str(file)!r} has no `model_type` (e.g. \"qwen2\", \"llama\"); "
                         "transformers cannot tell which architecture it describes")
    architectures = data.get("architectures")
    if architectures is not None and (
        not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
    ):
        raise ValueError(f"{key}: {str(file)!r}: `architectures` must be a list of class names, got {architectures!r}")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ValueError(f"{key}: {str(file)!r} is not a config transformers can read: {exc}") from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(
            f"{key}: {str(path)!r} holds a {type(config).__name__} ({config.model_type}) model, not a causal LM"
        )


_SAFETENSORS = "model.safetensors"
_PICKLE_WEIGHTS = "pytorch_model.bin"
_SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _weight_files(path: Path, key: str) -> list[Path]:
    """The weight files transformers would load from ``path``, in its order of preference: a single
    safetensors file, every shard of a sharded checkpoint's index, a single pickle file."""
    if (path / _SAFETENSORS).is_file():
        return [path / _SAFETENSORS]
    for name in _SHARD_INDEXES:
        if (path / name).is_file():
            return _index_shards(path / name, key)
    if (path / _PICKLE_WEIGHTS).is_file():
        return [path / _PICKLE_WEIGHTS]
    raise FileNotFoundError(
        f"{key}: {str(path)!r} has no model weights (expected {_SAFETENSORS}, {_PICKLE_WEIGHTS} or a sharded "
        f"checkpoint's {' / '.join(_SHARD_INDEXES)}); the model directory is incomplete"
    )


def _index_shards(index: Path, key: str) -> list[Path]:
    """The shard files a sharded checkpoint's index names; all must be present."""
    weight_map = _read_json_object(index, key).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{key}: {str(index)!r} has no `weight_map` (tensor name -> shard file)")
    shards = [index.parent / name for name in sorted(set(map(str, weight_map.values())))]
    missing = [str(shard) for shard in shards if not shard.is_file()]
    if missing:
        raise FileNotFoundError(f"{key}: {str(index)!r} names shard(s) that are missing: {', '.join(missing)}")
    return shards


def _check_weight_file(file: Path, key: str) -> None:
    """A safetensors file must have an intact header covering the whole file; any weight file must be non-empty.

    Reading only the header is cheap (no tensor is loaded) and catches the common damage: a truncated
    copy, a git-lfs pointer instead of the file, an interrupted write.
    """
    if file.stat().st_size == 0:
        raise ValueError(f"{key}: weight file {str(file)!r} is empty; copy the model again")
    if file.suffix != ".safetensors":
        return
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            handle.keys()
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError (and OSError)
        raise ValueError(
            f"{key}: weight file {str(file)!r} is corrupt or truncated ({exc}); copy the model again"
        ) from None


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _check_tokenizer_files(path: Path, key: str) -> None:
    """The directory must carry its tokenizer's vocabulary: without one, transformers quietly builds an
    empty tokenizer from config.json alone, and every prompt would be encoded wrongly."""
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{key}: {str(path)!r} has no tokenizer (expected one of {', '.join(_TOKENIZER_FILES)}); "
            "copy the model's tokenizer files into it"
        )
