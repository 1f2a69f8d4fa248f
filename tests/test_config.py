"""Config loading: YAML + overrides against the typed schema, and errors that name the key."""

import re
from pathlib import Path

import pytest

from drmas.cli import main
from drmas.assembly import load_config
from drmas.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def test_smoke_config_loads_and_overrides_apply():
    cfg = load_config(SMOKE, ["trainer.steps=7", "algorithm.estimator=global", "agents.solver.temperature=0.5"])
    assert cfg.trainer.steps == 7
    assert cfg.algorithm.chosen_estimator == "global"
    assert cfg.agents["solver"].temperature == 0.5
    assert cfg.agents["verifier"].max_new_tokens == 12
    assert cfg.models["policy"].builtin == "tiny"


def test_shipped_configs_are_valid():
    for path in sorted((ROOT / "configs").rglob("*.yaml")):  # configs/gpu/ too
        load_config(path)


def test_typo_in_key_names_key_and_suggestion():
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, ["trainer.stpes=3"])
    assert "trainer.stpes" in str(err.value) and "trainer.steps" in str(err.value)


def test_typo_inside_agent_entry_is_caught(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMOKE.read_text().replace("solver: {role: solver, model: policy}",
                                             "solver: {role: solver, model: policy, temprature: 0.3}"))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "agents.solver.temprature" in str(err.value) and "agents.solver.temperature" in str(err.value)


def test_wrong_type_names_key():
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, ["trainer.steps=many"])
    assert "trainer.steps" in str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.estimator=agentwise", "algorithm.estimator: 'agentwise' is not a registered advantage estimator"),
        ("algorithm.loss=trpo", "algorithm.loss: 'trpo' is not a registered policy loss"),
        ("algorithm.normalization=agentwise", "algorithm.normalization: 'agentwise' is not a registered"),
        ("algorithm.normalization=global algorithm.estimator=rloo", "set only algorithm.estimator"),
        ("agents.solver.model=nope", "agents.solver.model"),
        ("rollout.group_size=0", "rollout.group_size"),
        ("rollout.max_consecutive_episode_failures=0", "rollout.max_consecutive_episode_failures: must be >= 1"),
        ("rollout.max_episode_turns=0", "rollout.max_episode_turns: must be >= 1"),
        ("rollout.max_episode_tool_calls=0", "rollout.max_episode_tool_calls: must be >= 1"),
        ("rollout.episode_timeout_s=0", "rollout.episode_timeout_s: must be > 0"),
        ("rollout.plugin_call_timeout_s=-1", "rollout.plugin_call_timeout_s: must be >= 0"),
        ("rollout.max_stuck_plugin_calls=0", "rollout.max_stuck_plugin_calls: must be >= 1"),
        ("algorithm.dual_clip=0.5", "algorithm.dual_clip"),
        ("system.name=chess", "system.name"),
        ("models.policy.builtin=gpt5", "models.policy.builtin"),
        ("agents.solver.top_p=1.5", "agents.solver.top_p"),
        ("system.malformed_verdict=maybe", "system.malformed_verdict"),
        ("algorithm.singleton_clip=0", "algorithm.singleton_clip"),
        ("models.policy.collective_timeout_s=0", "models.policy.collective_timeout_s"),
        ("models.policy.heap_mmap_threshold_kb=65536", "models.policy.heap_mmap_threshold_kb"),
        ("models.policy.allocator=tcmalloc", "models.policy.allocator"),
    ],
)
def test_impossible_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, override.split())
    assert key in str(err.value)


def test_the_deprecated_normalization_key_still_chooses_the_estimator_and_says_so():
    with pytest.warns(FutureWarning, match="algorithm.estimator=step_global"):
        cfg = load_config(SMOKE, ["algorithm.normalization=step_global"])
    assert cfg.algorithm.chosen_estimator == "step_global"


def test_the_episode_bound_must_exceed_the_gateways_own():
    """The external system's gateway drops an episode its program did not end (system.episode_timeout_s) and says
    why; the general bound (rollout.episode_timeout_s) must not bite first."""
    config = ROOT / "examples" / "openai_agents" / "config.yaml"
    load_config(config, ["system.episode_timeout_s=600", "rollout.episode_timeout_s=601"])
    with pytest.raises(ConfigError, match=r"rollout.episode_timeout_s: 3600 s must exceed system.episode_timeout_s "
                                          r"\(7200 s\)"):
        load_config(config, ["system.episode_timeout_s=7200"])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load_config(tmp_path / "nowhere.yaml")


def test_a_missing_config_file_suggests_the_closest_one_beside_it(tmp_path, capsys):
    (tmp_path / "smoke.yaml").write_text("trainer: {steps: 1}\n")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'smoke.yml'} (did you mean {tmp_path / 'smoke.yaml'}?)")):
        load_config(tmp_path / "smoke.yml")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "other.yaml")  # nothing close: no suggestion
    assert "did you mean" not in str(err.value)
    assert main(["run", "--config", str(tmp_path / "smok.yaml")]) == 2
    assert f"did you mean {tmp_path / 'smoke.yaml'}?" in capsys.readouterr().err


def test_cli_config_show_prints_resolved_config(capsys):
    assert main(["config", "show", "--config", str(SMOKE), "trainer.steps=11"]) == 0
    out = capsys.readouterr().out
    assert "steps: 11" in out and "estimator: agent" in out


def test_cli_reports_config_error_before_work(capsys):
    assert main(["run", "--config", str(SMOKE), "trainer.stpes=3"]) == 2
    assert "trainer.steps" in capsys.readouterr().err


def test_an_unregistered_role_is_a_config_error_in_every_entry_point(capsys, tmp_path):
    """An agent's role is a registered name like the rest (docs/extending.md): `config show`, `run` and `eval`
    each exit 2 naming the key, with a suggestion and the known roles, before any model is built."""
    for command in (["config", "show"], ["run"], ["eval"]):
        assert main([*command, "--config", str(SMOKE), "agents.verifier.role=verifer",
                     f"trainer.output_dir={tmp_path}/run"]) == 2, command
        err = capsys.readouterr().err
        assert "agents.verifier.role: 'verifer' is not a registered agent role (did you mean 'verifier'?)" in err
        assert re.search(r"known: .*solver, .*verifier", err), err
    assert not (tmp_path / "run").exists()


def test_the_external_systems_roles_are_labels():
    """The external system serves agents by name: a role no module registered is only a label there."""
    cfg = load_config(ROOT / "examples" / "openai_agents" / "tools_config.yaml")
    assert cfg.agents["solver"].role == "tool_user"


def test_cli_refuses_an_unregistered_launcher_before_any_process(capsys, tmp_path):
    assert main(["run", "--config", str(SMOKE), "pipeline.mode=async", "pipeline.launcher=slurm",
                 f"trainer.output_dir={tmp_path}/run"]) == 2
    assert "pipeline.launcher: 'slurm' is not a registered launcher" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cli_config_keys_lists_help():
    from drmas.config import iter_help

    rows = {key: text for key, _, text in iter_help()}
    assert "algorithm.estimator" in rows and "Dr. MAS" in rows["algorithm.estimator"]
    assert "agents.<agent>.model" in rows
    # every section declares its fields with drmas.config.fields.help_field, wherever the section lives
    assert [key for key, text in rows.items() if not text.strip()] == []
    for key in ("pipeline.buffer.capacity_samples", "pipeline.restarts.max_restarts", "pipeline.ray.address",
                "pipeline.gpus.learners", "retrieval.backend", "pipeline.weights.chunk_mb"):
        assert key in rows, key


def test_mutable_config_defaults_are_not_shared_between_configs():
    from drmas.launch.gpus import GpuPlanConfig

    first, second = GpuPlanConfig(), GpuPlanConfig()
    first.learners["policy"] = [0]
    first.rollouts.append(1)
    assert second.learners == {} and second.rollouts == []


def test_typo_inside_pipeline_buffer_is_caught():
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, ["pipeline.buffer.capcity_samples=10"])
    assert "pipeline.buffer.capcity_samples" in str(err.value)
    assert "pipeline.buffer.capacity_samples" in str(err.value)


def test_pipeline_sections_take_nested_overrides():
    cfg = load_config(SMOKE, ["pipeline.mode=async", "pipeline.max_staleness=0", "pipeline.buffer.window=2",
                              "pipeline.buffer.max_running_groups=3", "pipeline.weights.chunk_mb=0.5",
                              "pipeline.learner_ports={policy: 7001}"])
    p = cfg.pipeline
    assert (p.mode, p.max_staleness, p.buffer.window, p.buffer.max_running_groups) == ("async", 0, 2, 3)
    assert p.weights.chunk_bytes == 1 << 19 and p.learner_ports == {"policy": 7001}


@pytest.mark.parametrize(
    "override, key",
    [
        ("pipeline.max_staleness=-1", "pipeline.max_staleness"),
        ("pipeline.mode=streaming", "pipeline.mode"),
        ("pipeline.buffer.window=0", "pipeline.buffer.window"),
        ("pipeline.weights.timeout_s=0", "pipeline.weights.timeout_s"),
        ("pipeline.learner_ports={nope: 7000}", "pipeline.learner_ports.nope"),
        ("pipeline.learner_ports={policy: 70000}", "pipeline.learner_ports.policy"),
        ("pipeline.launcher=ray", "pipeline.launcher=ray: launchers start the async pipeline"),
        ("pipeline.ray.host=everywhere", "pipeline.ray.host"),
        ("pipeline.ray.rollout_gpus=-1", "pipeline.ray.rollout_gpus"),
        ("pipeline.ray.object_store_mb=10", "pipeline.ray.object_store_mb"),
        ("pipeline.gpus.learners={policy: [0, 1]}", "pipeline.gpus.learners.policy: 2 GPU(s) for models.policy.ranks"),
        ("pipeline.gpus.learners={nope: [0]}", "pipeline.gpus.learners.nope: 'nope' is not a learner process"),
        ("pipeline.gpus.rollouts=[0, 0]", "pipeline.gpus.rollouts: [0, 0] repeats a GPU"),
        ("pipeline.gpus.rollouts=[0, 1, 2]", "do not split into slices of pipeline.gpus.per_rollout=2"),
        ("pipeline.gpus.per_rollout=0", "pipeline.gpus.per_rollout"),
    ],
)
def test_impossible_pipeline_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, [override, *(["pipeline.gpus.per_rollout=2"] if "per_rollout=2" in key else [])])
    assert key in str(err.value)


def test_gpu_plan_gives_learners_a_gpu_per_rank_and_rollouts_slices_round_robin_of_the_launchers_gpus():
    from drmas.launch.gpus import GpuAssignment

    cfg = load_config(SMOKE, ["pipeline.mode=async", "models.policy.ranks=2", "pipeline.gpus.learners={policy: [3, 0]}",
                              "pipeline.gpus.rollouts=[1, 2, 4, 5]", "pipeline.gpus.per_rollout=2"])
    plan = GpuAssignment(cfg.pipeline.gpus, ["GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e", "GPU-f"])  # the launcher's
    assert plan.for_learner("policy") == "GPU-d,GPU-a"  # rank 0 on the first listed
    assert [plan.for_rollout(i) for i in range(3)] == ["GPU-b,GPU-c", "GPU-e,GPU-f", "GPU-b,GPU-c"]
    assert GpuAssignment(load_config(SMOKE).pipeline.gpus, []).for_rollout(0) is None  # no plan: all GPUs
    with pytest.raises(ValueError, match=r"pipeline.gpus.rollouts: GPU 4 is not there: the launcher sees 4 GPU"):
        GpuAssignment(cfg.pipeline.gpus, ["0", "1", "2", "3"])
    with pytest.raises(ConfigError, match="pipeline.ray.learner_gpus_per_rank"):
        load_config(SMOKE, ["pipeline.mode=async", "pipeline.launcher=ray", "pipeline.gpus.rollouts=[0]"])


def test_path_may_override_a_shipped_builtin_but_a_model_needs_one_of_them(tmp_path):
    cfg = load_config(SMOKE, [f"models.policy.path={tmp_path}"])  # no `builtin=null` needed
    assert (cfg.models["policy"].path, cfg.models["policy"].builtin) == (str(tmp_path), "tiny")
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, ["models.policy.builtin=null"])
    assert "models.policy: set 'path'" in str(err.value) and "'builtin'" in str(err.value)


def test_own_model_config_runs_on_a_model_given_by_path(tiny_model_dir):
    from drmas import assembly
    own = ROOT / "configs" / "own_model.yaml"
    assert "models.policy.path=" in own.read_text()  # the header says how to point it at a model
    cfg = load_config(own, [f"models.policy.path={tiny_model_dir}"])
    assert cfg.pipeline.mode == "async"
    assert assembly.model_path(cfg, "policy") == tiny_model_dir


def test_training_on_vllm_with_top_p_below_one_is_refused_naming_the_key():
    smoke = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
    with pytest.raises(ConfigError, match=r"rollout.top_p: 0.9 with rollout.engine=vllm: .*solver, verifier"):
        load_config(smoke, ["rollout.engine=vllm", "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match=r"agents.verifier.top_p: 0.5 with rollout.engine=vllm: .*verifier would"):
        load_config(smoke, ["rollout.engine=vllm", "agents.verifier.top_p=0.5"])
    load_config(smoke, ["rollout.engine=vllm", "agents.verifier.top_p=0.5", "agents.verifier.trainable=false"])
    load_config(smoke, ["rollout.top_p=0.9"])  # the embedded engine reports the full distribution's log-probs
    with pytest.raises(ConfigError, match=r"rollout.engine_args: \['gpu_memory_utilization'\] are vLLM arguments"):
        load_config(smoke, ["rollout.engine_args={gpu_memory_utilization: 0.5}"])


def test_learner_ranks_are_documented_and_impossible_values_name_the_key():
    from drmas.config import iter_help

    rows = {key: text for key, _, text in iter_help()}
    assert "FSDP2" in rows["models.<model>.ranks"]
    assert load_config(SMOKE, ["pipeline.mode=async", "models.policy.ranks=2"]).models["policy"].ranks == 2
    for overrides, message in [
        (["models.policy.ranks=0"], "models.policy.ranks: must be >= 1"),
        (["pipeline.mode=colocated", "models.policy.ranks=2"], "models.policy.ranks=2: learner ranks need "
                                                               "pipeline.mode=async"),
        (["pipeline.mode=async", "models.policy.ranks=2", "models.policy.device=cuda:1"], "models.policy.ranks=2"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(SMOKE, overrides)


@pytest.mark.parametrize("override, message", [
    ("eval.benchmarks=[/data/aime.jsonl]", "bad value for 'eval.benchmarks': expected a mapping, got a list"),
    ("pipeline.gpus.rollouts={a: 1}", "bad value for 'pipeline.gpus.rollouts': expected a list, got a mapping"),
    ("agents=[solver, verifier]", "bad value for 'agents': expected a mapping, got a list"),
])
def test_a_list_for_a_mapping_or_the_reverse_names_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(SMOKE, [override])


@pytest.mark.parametrize("key", ["trainer.keep_checkpoints", "models.policy.optim.warmup_steps"])
def test_step_counts_must_not_be_negative(key):
    cfg = load_config(SMOKE, [f"{key}=3"])
    assert (cfg.trainer.keep_checkpoints if key.startswith("trainer") else cfg.models["policy"].optim.warmup_steps) == 3
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: must be >= 0"):
        load_config(SMOKE, [f"{key}=-1"])
