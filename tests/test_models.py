"""Model directories: config resolution errors, the tiny model, loading, checkpoints and the atomic cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drmas.config.schema import ModelConfig, TinyModelConfig
from drmas.core.cache import build_once
from drmas.models.dirs import hf_hub_cache
from drmas.models.loading import (
    build_tiny_model,
    load_model,
    resolve_model_path,
    save_checkpoint_model,
)

ROOT = Path(__file__).resolve().parents[1]


def test_missing_path_error_names_path_and_key(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="models.policy.path") as err:
        resolve_model_path(ModelConfig(path=str(missing)), where="models.policy")
    assert str(missing) in str(err.value)


def test_path_without_config_json_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(ModelConfig(path=str(tmp_path)), where="models.m")


def test_a_source_is_required() -> None:
    with pytest.raises(ValueError, match="models.solver: set `path`.*or `builtin`"):
        resolve_model_path(ModelConfig(), where="models.solver")


def test_path_overrides_builtin_and_says_so(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="drmas.models.loading"):
        got = resolve_model_path(ModelConfig(path=str(tiny_model_dir), builtin="smollm2-135m-instruct"),
                                 where="models.policy")
    assert got == tiny_model_dir  # the smollm2 builtin was not imported: it would take a minute
    assert "models.policy: using path" in caplog.text and "overrides builtin 'smollm2-135m-instruct'" in caplog.text


def test_unknown_builtin_lists_choices() -> None:
    with pytest.raises(ValueError, match="smollm2-135m-instruct, tiny"):
        resolve_model_path(ModelConfig(builtin="gpt5"))


def test_tiny_head_dim_below_32_rejected() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(TinyModelConfig(hidden_size=64, num_heads=4))


def test_builtin_tiny_resolves_to_cached_dir(tiny_model_dir: Path) -> None:
    assert resolve_model_path(ModelConfig(builtin="tiny")) == tiny_model_dir


def test_primed_tiny_model_is_cached_separately_and_learns_formats(tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    primed = build_tiny_model(TinyModelConfig(prime_steps=3))
    assert primed != tiny_model_dir and build_tiny_model(TinyModelConfig(prime_steps=3)) == primed
    base_w = load_file(tiny_model_dir / "model.safetensors")
    primed_w = load_file(primed / "model.safetensors")
    assert any(not torch.equal(base_w[k], primed_w[k]) for k in base_w)


def test_tiny_model_shape_and_tokenizer(tiny_model) -> None:
    model, tokenizer = tiny_model
    config = model.config
    assert config.model_type == "qwen2"
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert config.max_position_embeddings == 2048
    assert config.vocab_size == len(tokenizer)
    assert tokenizer.pad_token is not None and tokenizer.chat_template
    assert tokenizer.eos_token_id in (
        [model.generation_config.eos_token_id]
        if isinstance(model.generation_config.eos_token_id, int)
        else model.generation_config.eos_token_id
    )


def test_tiny_weights_follow_seed(tiny_model) -> None:
    model, _ = tiny_model
    other, _ = load_model(build_tiny_model(TinyModelConfig(seed=1)))
    assert not torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_load_model_rejects_non_causal_lm(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ValueError, match="not a causal LM"):
        load_model(tmp_path)


def test_checkpoint_reloads_with_identical_logits(tiny_model, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = tiny_model
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)  # a "trained" model, not the cached one
    out = save_checkpoint_model(model, tokenizer, tmp_path / "ckpt")
    assert (out / "model.safetensors").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tokenizer.encode("checkpoints must round-trip")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)


def test_build_once_keeps_the_winner_of_a_race(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"

    def build_while_another_process_publishes(out: Path) -> None:
        target.mkdir()
        (target / "who").write_text("other")
        (out / "who").write_text("me")

    assert build_once(target, build_while_another_process_publishes) is False  # theirs is kept
    assert (target / "who").read_text() == "other"
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no temp dir left behind


def test_build_once_cleans_up_after_a_failed_build(tmp_path: Path) -> None:
    target = tmp_path / "m"

    def failing(out: Path) -> None:
        (out / "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        build_once(target, failing)
    assert list(tmp_path.iterdir()) == []


def test_the_smollm2_conversion_says_what_it_does_and_where_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """The first use of the SmolLM2 builtin converts ~500 MB for about a minute: one line on stderr says so
    and names the cache directory, instead of a silent pause; later uses say nothing."""
    from drmas.models import loading

    monkeypatch.setenv("DRMAS_CACHE", str(tmp_path))
    monkeypatch.setattr(loading, "_save_smollm2", lambda out: (out / "config.json").write_text("{}"))  # not the real one
    target = loading.import_smollm2()
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "smollm2-135m-instruct" in err and str(target) in err
    assert "first use" in err
    assert loading.import_smollm2() == target and capsys.readouterr().err == ""


# ------------------------------------------------------------------------------- models by hub id


def _cache_as_hub_snapshot(model_dir: Path, hub_cache: Path, model_id: str, commit: str = "a" * 40) -> Path:
    """Lay ``model_dir`` out the way `hf download` leaves it in a hub cache; returns the snapshot directory."""
    repo = hub_cache / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache under a temporary HF_HOME (the user's real cache is never searched)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    return tmp_path / "hf_home" / "hub"


def test_model_id_resolves_from_the_local_hf_cache(tiny_model_dir: Path, hub_cache: Path) -> None:
    assert hf_hub_cache() == hub_cache
    snapshot = _cache_as_hub_snapshot(tiny_model_dir, hub_cache, "test-org/tiny-chat")
    got = resolve_model_path(ModelConfig(path="test-org/tiny-chat"), where="models.policy")
    assert got == snapshot
    model, tokenizer = load_model(got)
    assert model.config.model_type == "qwen2" and tokenizer.pad_token is not None


def test_hf_hub_cache_variable_is_honoured(tiny_model_dir: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    snapshot = _cache_as_hub_snapshot(tiny_model_dir, tmp_path / "elsewhere", "tiny-chat")  # an id without org
    assert resolve_model_path(ModelConfig(path="tiny-chat", builtin="tiny")) == snapshot


def test_uncached_model_id_names_key_id_cache_and_remedy(hub_cache: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path(ModelConfig(path="HuggingFaceTB/SmolLM2-135M-Instruct"), where="models.policy")
    message = str(err.value)
    assert message.startswith("models.policy.path: 'HuggingFaceTB/SmolLM2-135M-Instruct'")
    assert str(hub_cache) in message and "models--HuggingFaceTB--SmolLM2-135M-Instruct" in message
    assert "machine with network" in message and "local model directory" in message


def test_a_local_directory_wins_over_a_cached_id(tiny_model_dir: Path, hub_cache: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _cache_as_hub_snapshot(tiny_model_dir, hub_cache, "org/name")
    work = tmp_path / "work"
    shutil.copytree(tiny_model_dir, work / "org" / "name")
    monkeypatch.chdir(work)
    assert resolve_model_path(ModelConfig(path="org/name")) == Path("org/name")


# ------------------------------------------------------------------------- corrupt model directories


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny model that a test may damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "copy"))


def _damage_config(model: Path, text: str) -> Path:
    (model / "config.json").write_text(text)
    return model / "config.json"


def _damage_weights(model: Path, how: str) -> Path:
    weights = model / "model.safetensors"
    if how == "missing":
        weights.unlink()
        return model
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if how == "truncated" else b"version https://git-lfs.github.com/spec/v1\n")
    return weights


@pytest.mark.parametrize("damage, error, words", [
    (lambda m: _damage_config(m, "{not json"), ValueError, "is not valid JSON"),
    (lambda m: _damage_config(m, json.dumps({"architectures": ["Qwen2ForCausalLM"]})), ValueError, "no `model_type`"),
    (lambda m: _damage_config(m, json.dumps({"model_type": "no-such-arch"})), ValueError, "transformers can read"),
    (lambda m: _damage_config(m, "[1, 2]"), ValueError, "not an object"),
    (lambda m: _damage_weights(m, "missing"), FileNotFoundError, "has no model weights"),
    (lambda m: _damage_weights(m, "truncated"), ValueError, "corrupt or truncated"),
    (lambda m: _damage_weights(m, "lfs-pointer"), ValueError, "corrupt or truncated"),
    (lambda m: [(m / "tokenizer.json").unlink(), m][1], FileNotFoundError, "has no tokenizer"),
])
def test_corrupt_model_directory_names_the_file_and_key(model_copy: Path, damage, error, words: str) -> None:
    at_fault = damage(model_copy)
    for call in (lambda: resolve_model_path(ModelConfig(path=str(model_copy)), where="models.policy"),
                 lambda: load_model(model_copy, key="models.policy.path")):
        with pytest.raises(error) as err:
            call()
        message = str(err.value)
        assert message.startswith("models.policy.path: ") and str(at_fault) in message and words in message


def test_corrupt_tokenizer_file_names_the_directory_and_key(model_copy: Path) -> None:
    (model_copy / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="models.policy.path: the tokenizer in") as err:
        load_model(model_copy, key="models.policy.path")
    assert str(model_copy) in str(err.value)


def test_sharded_checkpoint_with_a_missing_shard_is_named(model_copy: Path) -> None:
    (model_copy / "model.safetensors").rename(model_copy / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors") as err:
        resolve_model_path(ModelConfig(path=str(model_copy)), where="models.m")
    assert "models.m.path" in str(err.value) and "model-00001" not in str(err.value)


@pytest.mark.e2e
def test_drmas_run_on_a_corrupt_model_exits_2_with_one_line(model_copy: Path, tmp_path: Path) -> None:
    config_json = _damage_config(model_copy, '{"model_type": "qwen2", ')
    proc = subprocess.run(
        [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke.yaml"),
         f"models.policy.path={model_copy}", f"trainer.output_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("drmas: ")]
    assert len(lines) == 1 and "models.policy.path" in lines[0] and str(config_json) in lines[0]


def test_a_plugins_priming_set_primes_its_own_model_and_bad_templates_are_named(tiny_model_dir: Path) -> None:
    """Issue 39 (2): a plugin registers the formats its roles write; the tiny model is primed on them, cached apart
    from the built-in sets' models and rebuilt when the set's content changes."""
    import random

    from drmas.api import PRIMING_FORMATS, PrimingFormats
    from drmas.models.priming import format_examples

    verdicts = PrimingFormats(exchanges=(([{"role": "system", "content": "Judge it."},
                                           {"role": "user", "content": "Is 3 right?"}], "<verdict>accept</verdict>"),),
                              replies=("<verdict>reject</verdict> {n}",))
    PRIMING_FORMATS.register("test_verdicts")(verdicts)
    drawn = format_examples(random.Random(0), 50, system="test_verdicts")
    assert {reply for _, reply in drawn} >= {"<verdict>accept</verdict>"}
    assert any(reply.startswith("<verdict>reject</verdict> ") and prompt is None for prompt, reply in drawn)
    primed = build_tiny_model(TinyModelConfig(prime_steps=2, prime_system="test_verdicts"))
    assert primed not in (tiny_model_dir, build_tiny_model(TinyModelConfig(prime_steps=2)))
    PRIMING_FORMATS.register("test_verdicts_edited")(PrimingFormats(replies=("<verdict>accept</verdict>",)))
    assert build_tiny_model(TinyModelConfig(prime_steps=2, prime_system="test_verdicts_edited")) != primed
    assert verdicts.problems("here") == []
    assert PrimingFormats().problems("here") == ["here: no replies and no exchanges to prime on"]
    broken = PrimingFormats(replies=("\\boxed{}", "{count}"))  # literal braces not doubled; an unknown field
    assert [m.split(" (")[0] for m in broken.problems("here")] == ["here: template '\\\\boxed{}' cannot be filled",
                                                                   "here: template '{count}' cannot be filled"]


def test_an_unknown_priming_set_is_a_config_error_naming_its_key() -> None:
    from drmas.assembly import load_config
    from drmas.config import ConfigError

    with pytest.raises(ConfigError, match=r"models\.policy\.tiny\.prime_system: 'maht' is not a registered priming "
                                          r"format set \(did you mean 'math'\?\)"):
        load_config(ROOT / "configs" / "smoke.yaml", ["models.policy.tiny.prime_system=maht"])
