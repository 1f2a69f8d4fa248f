"""Shared test fixtures: one model cache for the whole session, and the tiny random model.

Building the SmolLM2 tokenizer from its GGUF file costs seconds, so every test in a session shares one cache
directory (an existing ``DRMAS_CACHE`` is honoured, e.g. to reuse a warm cache between runs) instead of
rebuilding per test, and nothing is written to the user's ~/.cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
import torch

from drmas.config.schema import TinyModelConfig


@pytest.fixture(scope="session", autouse=True)
def drmas_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's model cache: $DRMAS_CACHE if set, else a session temp dir (set for the session, then restored)."""
    existing = os.environ.get("DRMAS_CACHE")
    if existing:
        yield Path(existing)
        return
    path = tmp_path_factory.mktemp("drmas-cache")
    os.environ["DRMAS_CACHE"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("DRMAS_CACHE", None)


@pytest.fixture(scope="session")
def tiny_model_dir(drmas_cache: Path) -> Path:
    """The default tiny random model's HF directory (built once per session cache)."""
    from drmas.models.loading import build_tiny_model

    return build_tiny_model(TinyModelConfig())


@pytest.fixture
def tiny_model(tiny_model_dir: Path):
    """A freshly loaded ``(model, tokenizer)`` of the tiny model; per test, so tests may change its weights."""
    from drmas.models.loading import load_model

    return load_model(tiny_model_dir)


@pytest.fixture
def float64() -> Iterator[None]:
    """torch's default dtype float64 for the test (exact hand-computed values), restored afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
