"""Fixtures of the retrieval tests: the 12-passage corpus, a BM25 retriever over it, a server on a free
loopback port (always shut down), and plain-HTTP helpers that return the status whatever it is."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from drmas.retrieval.base import Passage
from drmas.retrieval.bm25 import BM25Retriever
from drmas.retrieval.corpus import load_passages
from drmas.retrieval.server import RetrievalServer

FIXTURES = Path(__file__).parent / "fixtures" / "retrieval"
CORPUS = FIXTURES / "corpus.jsonl"

# passage id -> a query made of that passage's distinctive words
DISTINCTIVE_QUERIES = {
    "0": "copper lighthouse herring fleet",
    "1": "cartographer first complete map",
    "5": "gardener crystal fruit drought",
    "9": "juniper shepherds black-faced sheep",
    "10": "wading bird orange plumage frogs eels",
}


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return load_passages(CORPUS)


@pytest.fixture(scope="module")
def bm25(passages, tmp_path_factory) -> BM25Retriever:
    return BM25Retriever(passages, index_dir=tmp_path_factory.mktemp("bm25-index"), show_progress=False)


@pytest.fixture(scope="module")
def server(bm25):
    srv = RetrievalServer(bm25, host="127.0.0.1", port=0, default_topk=2, max_queries=4)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    """POST raw bytes; (status, decoded JSON body) whatever the status."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
