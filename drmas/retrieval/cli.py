"""`drmas retriever serve`: run a Search-R1 compatible retrieval server over a passages corpus.

`add_parser(subparsers)` registers the `retriever` command (with its `serve` sub-command) on the main CLI's
subparsers and sets `func=main`; `main(args)` runs it. Also runnable alone:
`python -m drmas.retrieval.cli serve --corpus FILE`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from drmas.runtime.netsec import is_loopback_host

DENSE_DEFAULT = "default"  # `--dense` given without a directory: the offline all-MiniLM-L6-v2 package


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `retriever serve ...` to an argparse subparsers object; returns the `retriever` parser."""
    retriever = subparsers.add_parser("retriever", help="retrieval services of the search system")
    sub = retriever.add_subparsers(dest="retriever_command", required=True)
    serve = sub.add_parser(
        "serve", help="serve a passages corpus over HTTP with the Search-R1 API (POST /retrieve, GET /health)")
    serve.add_argument("--corpus", required=True, help="passages jsonl ({'id', 'contents': 'title\\ntext'} per line)")
    serve.add_argument("--dense", nargs="?", const=DENSE_DEFAULT, default=None, metavar="MODEL_DIR",
                       help="dense retrieval with the sentence-embedding model in MODEL_DIR (no value: the offline "
                            "all-MiniLM-L6-v2 package); default: BM25")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; the server has no "
                       "authentication)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    serve.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    serve.add_argument("--index-dir", default=None, help="index cache root (default <DRMAS_CACHE>/indexes)")
    serve.add_argument("--batch-size", type=int, default=64, help="--dense: passages per forward pass when indexing")
    serve.add_argument("--max-queries", type=int, default=1024, help="most queries accepted in one request")
    retriever.set_defaults(func=main)
    return retriever


def main(args: argparse.Namespace) -> int:
    """Run `retriever serve` until interrupted; returns the exit code (2 for bad arguments or a bad corpus)."""
    from drmas.retrieval.corpus import load_passages
    from drmas.retrieval.server import RetrievalServer

    if args.topk < 1:
        print(f"drmas retriever serve: --topk must be >= 1, got {args.topk}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"drmas retriever serve: --port {args.port} is not a TCP port", file=sys.stderr)
        return 2
    if args.batch_size < 1 or args.max_queries < 1:
        print("drmas retriever serve: --batch-size and --max-queries must be >= 1", file=sys.stderr)
        return 2
    try:
        passages = load_passages(args.corpus)
        if args.dense is None:
            from drmas.retrieval.bm25 import BM25Retriever

            retriever = BM25Retriever(passages, index_dir=args.index_dir)
        else:
            from drmas.retrieval.dense import DenseRetriever

            model_dir = None if args.dense == DENSE_DEFAULT else args.dense
            retriever = DenseRetriever(passages, model_dir=model_dir, index_dir=args.index_dir,
                                       batch_size=args.batch_size)
        server = RetrievalServer(retriever, host=args.host, port=args.port, default_topk=args.topk,
                                 max_queries=args.max_queries)
    except (OSError, ValueError, ImportError) as exc:
        print(f"drmas retriever serve: {exc}", file=sys.stderr)
        return 2
    if not is_loopback_host(args.host):
        print(f"warning: the retrieval server listens on {args.host}, which is not a loopback address, and has no "
              "authentication: anyone who can reach this port can query it", file=sys.stderr)
    backend = "dense" if args.dense is not None else "bm25"
    print(f"serving {len(passages)} passages ({backend}) at {server.url}  (GET "
          f"{server.url.rsplit('/', 1)[0]}/health; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _standalone(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drmas.retrieval.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    # accept both `python -m drmas.retrieval.cli serve ...` and `... retriever serve ...`
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["retriever"]:
        argv = ["retriever", *argv]
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(_standalone())
