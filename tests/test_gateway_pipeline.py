"""The agent program of examples/openai_agents (plain `openai` client code, two agents, up to three calls per
episode) trained by `drmas run` in the async pipeline through the rollout's gateway: buffer, learner and rollout
processes as always, the program started by the rollout and stopped with it. Its first run dies in the middle of
an episode: the rollout drops that episode at once, abandons its group (without which a synchronous run would
wait for the group's admission slot until the buffer's lease timeout) and restarts the program, which trains on.
Every sample the gateway recorded has the log-probs the learner recomputes (the bound of the in-process path,
tests/test_pipeline_faults.py). The gateway itself: tests/test_gateway.py."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from pipeline_harness import smoke_model  # noqa: F401  (a fixture)
from test_launcher import ASYNC

from drmas.runtime.metrics import read_metrics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openai_agents"

CRASH_ONCE = """
import json, os, runpy, sys, time, urllib.error, urllib.request
marker = os.path.join(os.environ["MARKER_DIR"], "crashed")
if not os.path.exists(marker):  # the first run: claim an episode, make one call, die
    from openai import OpenAI
    while True:
        try:
            episode = json.load(urllib.request.urlopen(urllib.request.Request(
                os.environ["DRMAS_EPISODES_URL"], b"{}", {"Content-Type": "application/json"})))
            break
        except urllib.error.HTTPError as exc:  # 503: nothing admitted yet
            time.sleep(0.2)
    OpenAI(max_retries=0).chat.completions.create(model="solver", user=episode["id"], max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
    open(marker, "w").close()
    os._exit(3)
sys.argv = ["agents.py"]
runpy.run_path("agents.py", run_name="__main__")  # then the example program, unchanged
"""


@pytest.mark.timeout(500)
def test_an_openai_agent_program_trains_in_the_async_pipeline_through_a_crash(tmp_path, smoke_model):  # noqa: F811
    (tmp_path / "crash_once.py").write_text(CRASH_ONCE)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(EXAMPLE / "config.yaml"),
               f"system.workdir={EXAMPLE}", "system.command=" + json.dumps(["python", str(tmp_path / "crash_once.py")]),
               f"system.env={{MARKER_DIR: '{tmp_path}'}}", "system.restart_backoff_s=0.2", f"trainer.output_dir={out}",
               "trainer.steps=2", "eval.n_problems=0", "pipeline.max_staleness=0", *ASYNC]
    done = run_cli(command, timeout=450, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "crashed").exists()

    records = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for agent in ("solver", "verifier"):
        assert all(f"reward/{agent}/mean" in r for r in records), records[-1].keys()
    assert any(r["grad_norm/policy"] > 0 for r in records)  # the program's format penalties differ within groups
    diffs = [v for r in records for k, v in r.items() if k.startswith("logp_diff/policy/")]
    assert diffs and max(diffs) < 1e-3, diffs

    last = read_metrics(out / "rollout-0" / "metrics.jsonl")[-1]
    assert last["gateway/calls"] > 0 and last["gateway/program_restarts"] == 1
    assert last["rollout/dropped_episodes"] == 1 and last["gateway/dropped_episodes"] == 1
    log = (out / "rollout-0" / "process.log").read_text()
    assert re.search(r"episode \S+ dropped: the agent program \(system.command\) \(pid \d+\) exited with code 3", log)
    pids = [int(p) for p in re.findall(r"started the agent program \(system.command\): .* \(pid (\d+),", log)]
    assert len(pids) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in pids)  # stopped with its rollout
