"""Retrieval: corpus loading, BM25 and dense retrievers, their on-disk caches, the Search-R1 server and client, the CLI.

Everything runs for real on a 12-passage fixture corpus: bm25s, the bundled all-MiniLM-L6-v2 with faiss, an HTTP
server on 127.0.0.1 with a free port (always shut down), and `python -m drmas.retrieval.cli` in a subprocess.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from retrieval_harness import (  # noqa: F401  (fixtures)
    CORPUS,
    DISTINCTIVE_QUERIES,
    FIXTURES,
    bm25,
    get,
    passages,
    post,
    server,
)

from drmas.config.retrieval import RetrievalConfig
from drmas.retrieval.base import Passage
from drmas.retrieval.bm25 import BM25Retriever
from drmas.retrieval.client import HttpRetriever
from drmas.retrieval.corpus import (
    CorpusError,
    corpus_fingerprint,
    load_passages,
    write_passages,
)
from drmas.retrieval.factory import build_retriever

REPO = Path(__file__).resolve().parents[1]



# ------------------------------------------------------------------------------------------------ corpus


def test_corpus_loads_both_row_layouts():
    rows = load_passages(CORPUS)
    assert len(rows) == 12
    assert rows[3].id == "3" and rows[3].title == "Brasswick" and rows[3].text.startswith("Brasswick is a market")
    split = load_passages(FIXTURES / "corpus_title_text.jsonl")  # title + text fields, integer ids, a blank line
    assert [p.id for p in split] == ["1", "2"]
    assert split[1].contents == ("Marlowe Gap\nMarlowe Gap is a mountain pass used by salt caravans crossing the "
                                 "Ilvane range.")


@pytest.mark.parametrize("bad_line, expected", [
    ('{"id": "2", "contents": "Title\\ntext"', "invalid JSON"),
    ('{"id": "2"}', "missing field 'contents'"),
    ('{"contents": "Title\\ntext"}', "missing field 'id'"),
    ('{"id": "2", "contents": 7}', "'contents' must be a string"),
    ('{"id": ["2"], "contents": "T\\nx"}', "'id' must be a string or an integer"),
    ('{"id": "2", "title": "T"}', "'text' is missing"),
    ('["2", "T\\nx"]', "expected a JSON object"),
    ('{"id": "1", "contents": "again\\ntext"}', "duplicate id '1' (first seen on line 1)"),
])
def test_corrupt_corpus_line_is_reported_with_file_and_line_number(tmp_path, bad_line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "contents": "One\\nfirst"}\n\n' + bad_line + '\n{"id": "3", "contents": "x\\ny"}\n')
    with pytest.raises(CorpusError) as err:
        load_passages(path)
    assert f"{path}:3:" in str(err.value)
    assert expected in str(err.value)


def test_empty_or_missing_corpus_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(CorpusError, match="holds no passages"):
        load_passages(empty)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_passages(tmp_path / "nope.jsonl")
    # as the run reads it (the launcher, before any process starts), the error names the key first
    from drmas.config.retrieval import RetrievalConfig
    from drmas.retrieval.factory import corpus_for

    with pytest.raises(FileNotFoundError, match=r"^retrieval.corpus: corpus file not found: .*nope.jsonl"):
        corpus_for(RetrievalConfig(corpus=str(tmp_path / "nope.jsonl")), None)
    with pytest.raises(CorpusError, match=r"^retrieval.corpus: .*holds no passages"):
        corpus_for(RetrievalConfig(corpus=str(empty)), None)


def test_corpus_fingerprint_is_stable_and_content_sensitive(passages, tmp_path):
    reloaded = load_passages(write_passages(passages, tmp_path / "copy.jsonl"))
    assert corpus_fingerprint(reloaded) == corpus_fingerprint(passages)
    edited = list(passages)
    edited[4] = Passage(edited[4].id, edited[4].contents + ".")
    assert corpus_fingerprint(edited) != corpus_fingerprint(passages)
    assert corpus_fingerprint(list(reversed(passages))) != corpus_fingerprint(passages)


# -------------------------------------------------------------------------------------------------- BM25


@pytest.mark.parametrize("pid, query", sorted(DISTINCTIVE_QUERIES.items()))
def test_bm25_finds_passage_top1_from_its_distinctive_words(bm25, pid, query):
    hits = bm25.search([query], topk=3)[0]
    assert hits[0].passage.id == pid
    assert hits[0].score > hits[1].score


def test_bm25_topk_bounds_and_queries_without_indexed_words(bm25):
    assert len(bm25.search(["Brasswick"], topk=50)[0]) == 12  # fewer than topk when the corpus is smaller
    nothing = bm25.search(["", "the of and"], topk=2)  # empty / stopwords only: k passages, all score 0
    assert [[h.score for h in q] for q in nothing] == [[0.0, 0.0], [0.0, 0.0]]
    assert bm25.search([], topk=3) == []
    with pytest.raises(ValueError, match="topk"):
        bm25.search(["x"], topk=0)


def test_bm25_index_is_cached_on_disk_and_reused(passages, tmp_path):
    first = BM25Retriever(passages, index_dir=tmp_path, show_progress=False)
    assert first.built and first.index_path.parent == tmp_path and first.index_path.name.startswith("bm25-")
    stamp = {p.name: p.stat().st_mtime_ns for p in first.index_path.iterdir()}
    second = BM25Retriever(passages, index_dir=tmp_path, show_progress=False)
    assert not second.built and second.index_path == first.index_path
    assert {p.name: p.stat().st_mtime_ns for p in second.index_path.iterdir()} == stamp  # nothing rewritten
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dir left behind
    q = "amber heron reed islands"
    assert [h.passage.id for h in second.search([q], 3)[0]] == [h.passage.id for h in first.search([q], 3)[0]]
    other = BM25Retriever(passages[:6], index_dir=tmp_path, show_progress=False)  # another corpus: its own index
    assert other.built and other.index_path != first.index_path


def test_bm25_search_is_thread_safe(bm25):
    queries = list(DISTINCTIVE_QUERIES.values()) * 8
    expected = [[h.passage.id for h in q] for q in bm25.search(queries, 3)]
    results: list = [None] * 8
    errors: list = []

    def worker(i: int) -> None:
        try:
            results[i] = [[h.passage.id for h in q] for q in bm25.search(queries, 3)]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(r == expected for r in results)


# ------------------------------------------------------------------------------------------------- dense


@pytest.fixture(scope="module")
def dense_index_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dense-index")


@pytest.fixture(scope="module")
def dense(passages, dense_index_dir):
    from drmas.retrieval.dense import DenseRetriever

    return DenseRetriever(passages, index_dir=dense_index_dir, batch_size=5, show_progress=False)


@pytest.mark.parametrize("pid, query", sorted(DISTINCTIVE_QUERIES.items()))
def test_dense_finds_passage_top1_from_its_distinctive_words(dense, pid, query):
    hits = dense.search([query], topk=3)[0]
    assert hits[0].passage.id == pid
    assert 0 < hits[0].score <= 1.0001 and hits[0].score > hits[1].score  # cosine similarity


def test_dense_embeddings_are_cached_and_reused(dense, passages, dense_index_dir):
    from drmas.retrieval.dense import DenseRetriever

    assert dense.built and dense.index_path.parent == dense_index_dir
    embeddings = dense.index_path / "embeddings.npy"
    stamp = embeddings.stat().st_mtime_ns
    again = DenseRetriever(passages, index_dir=dense_index_dir, show_progress=False)
    assert not again.built and again.index_path == dense.index_path and embeddings.stat().st_mtime_ns == stamp
    q = ["opera house rebuilt in marble"]
    ids = [h.passage.id for h in again.search(q, 2)[0]]
    assert ids == [h.passage.id for h in dense.search(q, 2)[0]] and ids[0] == "6"


def test_dense_missing_model_directory_is_named(passages, tmp_path):
    from drmas.retrieval.dense import DenseRetriever

    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        DenseRetriever(passages, model_dir=missing, index_dir=tmp_path)


def test_dense_without_faiss_tells_how_to_install(passages, monkeypatch):
    from drmas.retrieval.dense import DenseRetriever

    monkeypatch.setitem(sys.modules, "faiss", None)  # what an environment without faiss-cpu looks like to import
    with pytest.raises(ImportError, match=r"pip install 'drmas\[dense\]'"):
        DenseRetriever(passages)


# ------------------------------------------------------------------------------------------------ factory


class _WorldTask:
    name = "world"

    def passages(self) -> list[Passage]:
        return [Passage("w1", "Zorblat\nZorblat is a violet moon of the planet Quenn."),
                Passage("w2", "Quenn\nQuenn is a gas giant with twelve moons.")]


def test_build_retriever_from_config(tmp_path):
    bm25 = build_retriever(RetrievalConfig(corpus=str(CORPUS), index_dir=str(tmp_path)), task=None,
                           show_progress=False)
    assert bm25.search(["clockmakers stone bridge"], 1)[0][0].passage.id == "3"
    from_task = build_retriever(RetrievalConfig(index_dir=str(tmp_path)), task=_WorldTask(), show_progress=False)
    assert from_task.search(["violet moon"], 1)[0][0].passage.id == "w1"
    http = build_retriever(RetrievalConfig(backend="http", url="http://127.0.0.1:9/retrieve", timeout_s=2.0,
                                           retries=5, max_queries_per_request=16))
    assert isinstance(http, HttpRetriever) and http.url == "http://127.0.0.1:9/retrieve"
    assert (http.timeout_s, http.retries, http.max_queries_per_request) == (2.0, 5, 16)


@pytest.mark.parametrize("cfg, task, expected", [
    (RetrievalConfig(), object(), "retrieval.corpus must be set"),
    (RetrievalConfig(backend="bm26", corpus=str(CORPUS)), None, "retrieval.backend: 'bm26'"),
    (RetrievalConfig(topk=0, corpus=str(CORPUS)), None, "retrieval.topk"),
    (RetrievalConfig(batch_size=0, corpus=str(CORPUS)), None, "retrieval.batch_size"),
    (RetrievalConfig(backend="http", url="localhost:8000"), None, "retrieval.url"),
    (RetrievalConfig(backend="http", timeout_s=0), None, "retrieval.timeout_s"),
    (RetrievalConfig(backend="http", retries=-1), None, "retrieval.retries: must be an integer >= 0"),
    (RetrievalConfig(backend="http", max_queries_per_request=0), None, "retrieval.max_queries_per_request"),
])
def test_build_retriever_rejects_bad_config_naming_the_key(cfg, task, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        build_retriever(cfg, task)


# ---------------------------------------------------------------------------------------------------- CLI


def test_add_parser_registers_retriever_serve():
    from drmas.retrieval import cli

    parser = argparse.ArgumentParser(prog="drmas")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["retriever", "serve", "--corpus", "c.jsonl", "--dense", "--port", "0"])
    assert args.func is cli.main and args.corpus == "c.jsonl" and args.dense == cli.DENSE_DEFAULT and args.port == 0
    assert parser.parse_args(["retriever", "serve", "--corpus", "c.jsonl"]).dense is None


def test_cli_bad_corpus_exits_2_with_line_number(tmp_path, capsys):
    from drmas.retrieval import cli

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "a\\nb"}\n{"id": 2}\n')
    parser = argparse.ArgumentParser(prog="drmas")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["retriever", "serve", "--corpus", str(bad), "--port", "0"])
    assert args.func(args) == 2
    assert f"{bad}:2:" in capsys.readouterr().err


def test_cli_serves_corpus_and_warns_on_non_loopback_host(tmp_path):
    env = dict(os.environ, DRMAS_CACHE=str(tmp_path), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "drmas.retrieval.cli", "serve", "--corpus", str(CORPUS), "--host", "0.0.0.0",
         "--port", "0", "--topk", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert "serving 12 passages (bm25) at http://0.0.0.0:" in line, line + proc.stderr.read()
        port = int(line.split("http://0.0.0.0:")[1].split("/")[0])
        hits = HttpRetriever(f"http://127.0.0.1:{port}/retrieve", timeout_s=10).search(["eleven arches"], 5)
        assert len(hits[0]) == 5 and hits[0][0].passage.id == "3"
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "not a loopback address" in err and "no authentication" in err
