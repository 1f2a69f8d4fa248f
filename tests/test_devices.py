"""Device placement on a machine without a GPU: what `auto` means, and GPU requests refused by key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from drmas.config import ConfigError, read_config
from drmas.models.devices import compute_autocast, resolve_device
from drmas.weights.transport import resolve_backend

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_auto_means_cpu_here_and_a_gpu_request_is_refused_naming_the_key():
    assert resolve_device("auto", "models.policy.device") == torch.device("cpu")
    assert resolve_device("cpu", "models.policy.device") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"models.policy.device=cuda:1: this process sees no CUDA device"):
        resolve_device("cuda:1", "models.policy.device")
    # CPU tensors travel over gloo even where NCCL would be available; only CUDA tensors take NCCL
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    with pytest.raises(ValueError, match="nccl"):
        resolve_backend("nccl", torch.device("cpu"))
    cpu = torch.device("cpu")
    with compute_autocast(cpu, torch.float32, torch.float32):  # the default contract: plain float32
        assert not torch.is_autocast_enabled("cpu")
    with compute_autocast(cpu, torch.bfloat16, torch.bfloat16):  # bfloat16 weights compute as they are
        assert not torch.is_autocast_enabled("cpu")
    with compute_autocast(cpu, torch.float32, torch.bfloat16):  # float32 master weights, bfloat16 passes
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_a_malformed_device_is_refused_at_config_time():
    with pytest.raises(ConfigError, match=r"models.policy.device: 'gpu0' is not a device"):
        read_config(SMOKE, ["models.policy.device=gpu0"])
    assert read_config(SMOKE, ["models.policy.device=cuda:3"]).models["policy"].device == "cuda:3"


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_a_run_asking_for_a_gpu_that_is_not_there_exits_with_a_message(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(SMOKE), f"trainer.output_dir={tmp_path}/run",
               "models.policy.device=cuda", "eval.n_problems=0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "models.policy.device=cuda" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_learner_ranks_beyond_the_machine_are_refused_naming_the_key():
    from drmas.models.devices import check_ranks

    cores = len(os.sched_getaffinity(0))
    check_ranks("cpu", cores, "models.policy.ranks")  # one rank per core fits
    with pytest.raises(ValueError, match=rf"models.policy.ranks={cores + 1}: each learner rank needs a CPU core"):
        check_ranks("auto", cores + 1, "models.policy.ranks")
    with pytest.raises(ValueError, match=r"models.policy.device=cuda: this process sees no CUDA device"):
        check_ranks("cuda", 2, "models.policy.ranks")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_learner_ranks_over_several_nodes_need_only_this_nodes_share(monkeypatch):
    from drmas.models.devices import check_ranks

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores))  # torchrun --nnodes 2 --nproc-per-node <cores>
    check_ranks("cpu", 2 * cores, "models.policy.ranks")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores + 1))
    with pytest.raises(ValueError, match=rf"models.policy.ranks={2 * cores + 2}: each learner rank needs a CPU core"):
        check_ranks("cpu", 2 * cores + 2, "models.policy.ranks")
