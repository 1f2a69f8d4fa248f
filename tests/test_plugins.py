"""Plugins: a system that lives outside the package (tests/fixtures/plugins/toy_mas.py, loaded by `plugins:` in
toy.yaml) trained by `drmas run` in the async pipeline; plugins named by module, file or `drmas.plugins` entry
point; one clear error (rc 2, the key named, no process started) for one that cannot be imported; scripted
agents and per-agent stop strings in the config; plugins import `drmas.api` only.
(The Ray launcher with a plugin: tests/test_ray_launcher.py; a generated plugin in the colocated loop:
tests/test_new_system.py.)"""

from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from test_launcher import ASYNC

from drmas.assembly import agent_specs, load_config
from drmas.api import AGENT_ROLES
from drmas.api.testing import ScriptedSystem
from drmas.cli import main
from drmas.config import ConfigError, read_config
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "plugins"
TOY = FIXTURES / "toy.yaml"
TOY_PLUGIN = FIXTURES / "toy_mas.py"
MEDIAN_PLUGIN = ROOT / "examples" / "estimators" / "median_baseline.py"


@pytest.mark.e2e
@pytest.mark.timeout(500)
def test_a_plugin_system_trains_in_the_async_pipeline(tmp_path):
    """toy.yaml names its plugin relative to itself (`./toy_mas.py`); run from another directory, the launcher,
    the buffer, the learner and the rollout (each loading the config the launcher wrote into the output
    directory) all find it. Its proposer and checker train on per-agent rewards; its scripted referee, served
    by no model, makes no sample; its calculator tool answers the episodes' batched calls. The learner takes its
    advantages from a second plugin's estimator (examples/estimators) and its loss from the registry (cispo)."""
    out = tmp_path / "run"
    plugins = f"plugins=[{TOY_PLUGIN},{MEDIAN_PLUGIN}]"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(TOY), f"trainer.output_dir={out}", *ASYNC,
               plugins, "algorithm.estimator=agent_median", "algorithm.loss=cispo"]
    done = run_cli(command, timeout=450, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out accuracy before training" in done.stdout  # the launcher built the plugin's system too
    records = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for agent in ("proposer", "checker"):
        assert all(f"reward/{agent}/mean" in r for r in records), records[-1].keys()
        assert all(math.isfinite(r[f"advantage/{agent}/sq_mean"]) for r in records)
    assert not any(key.startswith(("reward/referee", "advantage/referee")) for r in records for key in r)
    # the config every process loaded names the plugin by its absolute path
    assert f"- {TOY_PLUGIN}" in (out / "config.yaml").read_text()
    rollout = read_metrics(out / "rollout-0" / "metrics.jsonl")
    assert any(r.get("throughput/rollout/episodes_per_s", 0) > 0 for r in rollout)
    # the plugin's episode info reaches the rollout's metrics, as the mean over the episodes of each report
    reported = [r for r in rollout if "episode/count" in r]
    assert reported and all(0 <= r["episode/info/approved"] <= 1 and "episode/reward_mean" in r for r in reported)


def _config_with(tmp_path: Path, source: str | None, entry: str = "./broken.py") -> Path:
    if source is not None:
        (tmp_path / entry).write_text(source)
    config = tmp_path / "mas.yaml"
    config.write_text(SMOKE.read_text() + f"plugins: [{TOY_PLUGIN}, {entry}]\n")
    return config


@pytest.mark.parametrize(("source", "entry", "expected"), [
    ("import no_such_module_for_drmas\n", "./broken.py",
     r"plugins\[1\]: \./broken\.py \(.*broken\.py\): ModuleNotFoundError: No module named 'no_such_module_for_drmas' "
     r"\(at broken\.py:1\)"),
    ("def f(:\n    pass\n", "./broken.py", r"plugins\[1\]: \./broken\.py .*: SyntaxError: .* \(broken\.py, line 1\)"),
    ("x = 1\nraise RuntimeError('needs a GPU')\n", "./broken.py",
     r"plugins\[1\]: \./broken\.py .*: RuntimeError: needs a GPU \(at broken\.py:2\)"),
    ("from drmas.api import ORCHESTRAS\n\n@ORCHESTRAS.register('math')\nclass Mine:\n    pass\n", "./broken.py",
     r"plugins\[1\]: .*: ValueError: orchestra 'math' is already registered \(by drmas\.mas\.math\); a name cannot "
     r"be registered twice"),
    (None, "./nowhere.py", r"plugins\[1\]: \./nowhere\.py .*: FileNotFoundError: no such file: .*nowhere\.py"),
    (None, "no_such_pkg.mas", r"plugins\[1\]: no_such_pkg\.mas: ModuleNotFoundError: No module named 'no_such_pkg'"),
    ("x = 1\n", "./1st-try.py", r"plugins\[1\]: \./1st-try\.py .*: ValueError: '1st-try\.py' cannot be a module name"),
    ("x = 1\n", "./yaml.py", r"plugins\[1\]: \./yaml\.py .*: ValueError: the module name 'yaml' is taken by .*yaml.*; rename"),
    ("x = 1\n", "./bm25s.py", r"plugins\[1\]: \./bm25s\.py .*: ValueError: the module name 'bm25s' is taken by .*"),
])
def test_a_plugin_that_cannot_be_imported_is_one_error_naming_its_key(tmp_path, capsys, monkeypatch, source, entry,
                                                                      expected):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the directories of file plugins are appended to it
    assert main(["config", "show", "--config", str(_config_with(tmp_path, source, entry))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drmas: config error: plugins[1]: ") and len(err.strip().splitlines()) == 1, err
    assert re.search(expected, err), err


@pytest.mark.e2e
def test_drmas_run_of_a_broken_plugin_exits_2_before_any_process_starts(tmp_path):
    config = _config_with(tmp_path, "def f(:\n")
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", str(config), *ASYNC,
                    f"trainer.output_dir={tmp_path / 'run'}"], timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "plugins[1]: ./broken.py" in done.stderr and "SyntaxError" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout and "started" not in done.stdout
    assert not (tmp_path / "run").exists()


def test_plugin_paths_are_relative_to_the_config_file_or_on_the_command_line_to_the_working_directory(
        tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "mas.yaml"
    config.write_text(SMOKE.read_text() + "plugins: [./here.py, ../up/there.py, my_pkg.my_mas]\n")
    monkeypatch.chdir(tmp_path)  # the config-only loader imports nothing: the paths need not exist
    assert read_config(config).plugins == [str(tmp_path / "conf" / "here.py"), str(tmp_path / "up" / "there.py"),
                                                  "my_pkg.my_mas"]
    assert read_config(config, ["plugins=[./cli.py]"]).plugins == [str(tmp_path / "cli.py")]
    with pytest.raises(ConfigError, match=r"bad value for 'plugins': expected a list of module names or \.py file"):
        read_config(config, ["plugins=./one.py"])


def _site_with_entry_point(site: Path, module: str, source: str) -> None:
    """A package installed on `site` (as pip leaves one): its module and a dist-info with a drmas.plugins entry."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[drmas.plugins]\n{module} = {module}\n")


ECHO_PLUGIN = '''
from dataclasses import dataclass
from drmas.api import ORCHESTRAS, SystemSettings, help_field


@dataclass
class EchoSettings(SystemSettings):
    name: str = SystemSettings.name_field("ep_echo")
    words: int = help_field(1, "Words to echo.")


@ORCHESTRAS.register("ep_echo", settings=EchoSettings)
class Echo:
    pass
'''


def test_an_installed_packages_entry_point_is_imported_without_being_listed(tmp_path, monkeypatch):
    _site_with_entry_point(tmp_path, "ep_echo_plugin", ECHO_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(SMOKE, ["system.name=ep_echo", "system.words=3"])
    assert type(cfg.system).__name__ == "EchoSettings" and cfg.system.words == 3


ENGINE_PLUGIN = '''
from drmas.api import ENGINES, EngineAbilities


@ENGINES.register("ep_remote", traits=EngineAbilities(takes_engine_args=True, needs=("ep_no_such_client", "pip it")))
def remote_engine(*args, **kwargs):
    raise RuntimeError("never built by a config check")
'''


def test_a_plugin_engine_declares_its_abilities_as_the_built_ins_do(tmp_path, monkeypatch):
    """An engine's abilities are declared where it registers, and the config check reads them without building
    (or importing) the engine: engine arguments taken, adapters refused, a missing package named where it runs."""
    from drmas.api import ENGINES, EngineAbilities
    from drmas.assembly import require_packages

    assert ENGINES.traits("vllm").takes_engine_args and ENGINES.traits("embedded").serves_adapters
    assert ENGINES.traits("embedded") == EngineAbilities(serves_adapters=True)
    _site_with_entry_point(tmp_path, "ep_engine_plugin", ENGINE_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(SMOKE, ["rollout.engine=ep_remote", "rollout.engine_args={endpoint: here}"])
    assert ENGINES.traits("ep_remote") == EngineAbilities(takes_engine_args=True, needs=("ep_no_such_client", "pip it"))
    with pytest.raises(ValueError, match="rollout.engine=ep_remote: the ep_no_such_client package is not installed here: "
                                         "pip it"):
        require_packages(cfg)
    with pytest.raises(ConfigError, match=r"rollout.engine: 'ep_remote' serves no LoRA adapters"):
        load_config(SMOKE.parent / "smoke_lora.yaml", ["rollout.engine=ep_remote"])
    with pytest.raises(TypeError, match=r"engine 'ep_bad': traits must be a EngineAbilities, got \{'serves_adapters'"):
        ENGINES.register("ep_bad", traits={"serves_adapters": True})


def test_an_entry_point_that_cannot_be_imported_is_named(tmp_path, monkeypatch):
    _site_with_entry_point(tmp_path, "ep_broken_plugin", "raise ImportError('needs vllm')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^entry point ep_broken_plugin = ep_broken_plugin \(group drmas\.plugins\): "
                                          r"ImportError: needs vllm"):
        load_config(SMOKE)


def test_a_plugins_settings_roles_and_scripted_agents_are_checked_like_the_built_ins(capsys):
    cfg = load_config(TOY)
    assert type(cfg.system).__name__ == "ToySettings" and cfg.system.attempts == 2
    assert type(cfg.task).__name__ == "SumsSettings" and cfg.task.n_train == 32
    specs = agent_specs(cfg)
    assert specs["checker"].sampling.stop == ("</verify>", "\n\n")  # the role's stop strings, then the agent's
    assert specs["referee"].script is not None and specs["referee"].model == ""
    assert load_config(TOY) == cfg  # loading again imports the plugin once (no "already registered")
    # its roles are the system's own: no global registration, and each is built with the system's settings
    assert not {"proposer", "checker", "referee"} & set(AGENT_ROLES.names())
    with ScriptedSystem(TOY, ["system.checker_reward=0.5"]) as system:
        assert all(role.settings is cfg_settings for cfg_settings in [system.cfg.system]
                   for role in system.orchestra.roles.values())
        problem = system.problems()[0]
        played = system.play([f"\\boxed{{{problem.answer}}}", "<verify>approve</verify>"], problem)
    # the scripted referee answered by its role (no reply of the script); the checker paid system.checker_reward
    assert played.agents_asked() == ["proposer", "referee", "checker"] and played.rewards == [1.0, 1.0, 0.5]
    for overrides, message in [
        (["system.atempts=3"], "unknown config key 'system.atempts' (did you mean 'system.attempts'?); valid keys of "
                               "system 'toy' here: attempts, checker_reward, name"),
        (["system.attempts=0"], "system.attempts: must be >= 1, got 0"),
        (["task.max_value=zero"], "bad value for 'task.max_value'"),
        (["agents.referee.model=policy"], "agents.referee.model: role 'referee' is scripted (its turns are computed by "
                                          "code): its agent is served by no model"),
        (["agents.referee.temperature=0.5", "agents.referee.stop=[x]"],
         "agents.referee: role 'referee' is scripted: temperature, stop would sample nothing"),
        (["agents.proposer.model="], "agents.proposer.model: required (a key of 'models'); only an agent whose role "
                                     "is scripted takes none"),
        (["agents.checker.stop=['']"], "agents.checker.stop: stop strings must be non-empty"),
        # the system's own roles (its system_roles, not registered) are named where a role is unknown
        (["agents.checker.role=chekcer"], "agents.checker.role: 'chekcer' is not a registered agent role"),
        (["agents.checker.role=chekcer"], "the 'toy' system's own roles: checker, proposer, referee"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(TOY, overrides)
        assert message in str(err.value), (overrides, str(err.value))
    assert main(["config", "keys", "--config", str(TOY)]) == 0
    listed = capsys.readouterr().out
    assert "system.attempts = 2\n    [toy] Proposals at most per episode" in listed
    # the chosen system's and task's settings only (not the search system's, say), and how to see them all
    assert "system.max_turns" not in listed and "task.n_train = 64\n    [sums]" in listed and "--all" in listed
    assert main(["config", "keys", "--config", str(TOY), "--all"]) == 0
    assert "[search]" in capsys.readouterr().out


def _drmas_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return [name for name in found if name == "drmas" or name.startswith("drmas.")]


def test_plugins_and_examples_import_only_drmas_api():
    """The public API is one module: the example systems (examples/), the plugin fixtures and the skeleton of
    `drmas new-system` import nothing else of drmas."""
    files = [*FIXTURES.rglob("*.py"), *(ROOT / "examples").rglob("*.py"), ROOT / "drmas" / "scaffold" / "system_template.py"]
    assert TOY_PLUGIN in files
    offending = {str(f.relative_to(ROOT)): names for f in files
                 if (names := [n for n in _drmas_imports(f) if n != "drmas.api"])}
    assert offending == {}


def test_drmas_eval_runs_a_plugin_system(tmp_path):
    """`drmas eval` imports the config's plugins like every entry point: avg@k of the plugin's system, with the
    behaviour of each agent, the scripted referee's turns included."""
    import json

    out = tmp_path / "eval"
    assert main(["eval", "--config", str(TOY), "eval.k=1", "eval.max_questions=1", f"trainer.output_dir={out}",
                 "logging.tensorboard=false"]) == 0
    (report_file,) = (out / "evals").glob("initial-k1-*/eval.json")
    report = json.loads(report_file.read_text())
    assert set(report["behaviour"]["sums"]["agents"]) == {"proposer", "referee", "checker"}


def test_the_complete_example_of_docs_extending_is_the_tested_plugin():
    """docs/extending.md shows the plugin and config trained here: each block marked `<!-- file: PATH -->`
    equals that file."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.DOTALL)
    assert {path for path, _ in blocks} == {"tests/fixtures/plugins/toy_mas.py", "tests/fixtures/plugins/toy.yaml"}
    for path, block in blocks:
        assert block == (ROOT / path).read_text(), path
