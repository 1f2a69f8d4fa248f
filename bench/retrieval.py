"""Recall@k of the gold passages on the generated multi-hop world, and retrieval speed.

For each held-out question (question text as the query) it reports, per hop count:
- first-hop recall@k: the passage of the question's subject (what the first search must find) is in the top k;
- all-support recall@k: every support passage is in the top k of that one query (a 2-hop question's second
  passage is about the bridge entity, which the question does not name: the second search has to find it);
- bridge recall@k: the bridge entity's passage is in the top k when the bridge's name is the query (what a
  good second search asks).
Speed: index build, cached reload and per-query time of a batch of all questions. Same world and split as
training (`task.*` keys of the config); `retrieval.backend=dense` measures the dense retriever instead.

    python bench/retrieval.py --config configs/search_quickstart.yaml [--k 3] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict

from drmas import assembly
from drmas.config import read_config
from drmas.retrieval.factory import build_retriever


def recall_table(problems, passages_by_id, retriever, k: int) -> dict:
    """Per hop count (and 'all'): first-hop, all-support and bridge recall@k over `problems`."""
    hits = retriever.search([p.question for p in problems], k)
    bridges = [p for p in problems if p.meta.get("bridge")]
    bridge_names = [passages_by_id[p.meta["support_ids"][1]].contents.split("\n", 1)[0] for p in bridges]
    bridge_hits = dict(zip((p.uid for p in bridges), retriever.search(bridge_names, k))) if bridges else {}
    counts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for problem, found in zip(problems, hits):
        ids = {h.passage.id for h in found}
        support = problem.meta["support_ids"]
        for group in (f"{problem.meta['hops']}-hop", "all"):
            counts[group]["first_hop"].append(float(support[0] in ids))
            counts[group]["all_support"].append(float(all(s in ids for s in support)))
            if problem.uid in bridge_hits:
                counts[group]["bridge_by_name"].append(
                    float(support[1] in {h.passage.id for h in bridge_hits[problem.uid]}))
    return {group: {"n": len(c["first_hop"]), **{m: sum(v) / len(v) for m, v in c.items()}}
            for group, c in sorted(counts.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/search_quickstart.yaml")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--split", default="test")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = read_config(args.config, args.overrides)
    task = assembly.build_task(cfg)
    problems = list(task.split(args.split))
    passages = task.passages()
    with tempfile.TemporaryDirectory() as index_dir:  # a fresh index, so the build is timed
        cfg.retrieval.index_dir = index_dir
        start = time.perf_counter()
        build_retriever(cfg.retrieval, task, show_progress=False)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        retriever = build_retriever(cfg.retrieval, task, show_progress=False)
        reload_s = time.perf_counter() - start
        start = time.perf_counter()
        retriever.search([p.question for p in problems], args.k)
        query_ms = 1000 * (time.perf_counter() - start) / len(problems)
        table = recall_table(problems, {p.id: p for p in passages}, retriever, args.k)
    report = {"backend": cfg.retrieval.backend, "k": args.k, "split": args.split, "passages": len(passages),
              "questions": len(problems), "build_s": build_s, "cached_reload_s": reload_s,
              "ms_per_query": query_ms, "recall": table}
    print(json.dumps(report, indent=1))
    print(f"\n{cfg.retrieval.backend} recall@{args.k} on {len(problems)} {args.split} questions, {len(passages)} passages")
    print(f"{'group':<8}{'n':>5}{'first hop':>12}{'all support':>13}{'bridge by name':>16}")
    for group, row in table.items():
        bridge = f"{row['bridge_by_name']:.3f}" if "bridge_by_name" in row else "-"
        print(f"{group:<8}{row['n']:>5}{row['first_hop']:>12.3f}{row['all_support']:>13.3f}{bridge:>16}")
    print(f"build {build_s:.2f} s, cached reload {reload_s:.3f} s, {query_ms:.3f} ms/query (batch of {len(problems)})")


if __name__ == "__main__":
    main()
