"""Model directories: config resolution errors, the tiny model, loading, checkpoints and the atomic cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from drmas.cache import build_once
from drmas.config.schema import ModelConfig, TinyModelConfig
from drmas.models import (
    build_tiny_model,
    load_model,
    resolve_model_path,
    save_checkpoint_model,
)


def test_missing_path_error_names_path_and_key(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="models.policy.path") as err:
        resolve_model_path(ModelConfig(path=str(missing)), where="models.policy")
    assert str(missing) in str(err.value)


def test_path_without_config_json_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(ModelConfig(path=str(tmp_path)), where="models.m")


@pytest.mark.parametrize("path, builtin", [("/some/dir", "tiny"), (None, None)])
def test_exactly_one_source_required(path: str | None, builtin: str | None) -> None:
    with pytest.raises(ValueError, match="models.solver"):
        resolve_model_path(ModelConfig(path=path, builtin=builtin), where="models.solver")


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
