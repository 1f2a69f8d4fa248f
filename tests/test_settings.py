"""`system.*` and `task.*` are read with the settings class of the system or task they name: the built-ins'
as a plugin's (tests/test_plugins.py), with the errors and did-you-mean hints of every config section."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from drmas.assembly import load_config
from drmas.cli import main
from drmas.config import ConfigError, read_config
from drmas.config.sections import SYSTEM_SETTINGS, SystemSettings
from drmas.config.systems import MathSettings, ReviseSettings, SearchSettings
from drmas.config.tasks import ArithmeticSettings, MathFileSettings
from drmas.core.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def test_each_system_and_task_gets_its_own_settings_class():
    cfg = load_config(SMOKE)
    assert cfg.system == MathSettings(max_rounds=2, malformed_verdict="approve")
    assert isinstance(cfg.task, ArithmeticSettings) and cfg.task.max_value == 4
    stability = load_config(ROOT / "configs" / "stability.yaml")
    assert stability.system == ReviseSettings(max_rounds=2)
    search = load_config(ROOT / "configs" / "search_smoke.yaml")
    assert isinstance(search.system, SearchSettings) and search.system.history_max_chars == 600


def test_switching_the_system_on_the_command_line_drops_the_other_systems_keys():
    """smoke.yaml sets math's max_rounds and malformed_verdict; `system.name=search` on top of it is a search
    config (those keys belong to another registered system, as they were ignored before every system had its
    own settings), and `task.name=math_file` a math_file one."""
    cfg = load_config(SMOKE, ["system.name=search", "system.max_turns=3", "task.name=math_file",
                              "task.test_file=t.jsonl"])
    assert cfg.system == SearchSettings(max_turns=3)
    assert cfg.task == MathFileSettings(test_file="t.jsonl", answer_extraction="flexible")  # a key both have: kept


@pytest.mark.parametrize(("overrides", "message"), [
    (["system.max_round=3"], "unknown config key 'system.max_round' (did you mean 'system.max_rounds'?); valid keys "
                             "of system 'math' here: malformed_verdict, max_rounds, name"),
    (["system.name=search", "system.malformed_route=ask"], "system.malformed_route: 'ask' is not one of answer, search"),
    (["system.name=search", "system.max_turns=many"], "bad value for 'system.max_turns'"),
    (["task.operations=+/"], "task.operations: must be a non-empty subset of '+-*'"),
    (["task.name=math_file"], "task.train_file: the math_file task needs task.train_file and/or task.test_file"),
    (["task.nosuch=1"], "unknown config key 'task.nosuch'"),
])
def test_settings_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, overrides)
    assert message in str(err.value)


def test_a_name_nothing_registered_is_reported_and_the_settings_only_loader_keeps_the_name_alone():
    with pytest.raises(ConfigError, match=r"system.name: 'negotiation' is not a registered orchestra.*plugins"):
        load_config(SMOKE, ["system.name=negotiation", "system.rounds=3"])
    # the buffer reads configs without importing the systems: it keeps the name, checks no key it cannot know
    assert read_config(SMOKE, ["system.name=negotiation", "system.rounds=3"]).system == SystemSettings(name="negotiation")


def test_config_keys_lists_the_settings_of_every_registered_system_and_task(capsys):
    assert main(["config", "keys"]) == 0
    out = capsys.readouterr().out
    assert "system.max_turns = 4\n    [search] Router-routed turns" in out
    assert "system.max_rounds = 2\n    [math_revise] Attempts in all" in out
    assert "task.two_hop_share = 0.5\n    [multihop]" in out
    assert "agents.<agent>.stop = []" in out and "plugins = []" in out


def test_a_settings_class_must_be_a_dataclass_of_the_sections_base_with_defaults():
    registry = Registry("orchestra", settings=SYSTEM_SETTINGS)

    class NotADataclass(SystemSettings):
        rounds: int = 3

    @dataclass
    class NoDefault(SystemSettings):
        rounds: int = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="must be a @dataclass subclassing SystemSettings"):
        registry.register("x", settings=NotADataclass)(object)
    with pytest.raises(TypeError, match="must be a @dataclass subclassing SystemSettings"):
        registry.register("x", settings=dict)(object)
    with pytest.raises(TypeError, match="takes no settings class"):
        Registry("engine").register("x", settings=NoDefault)
    assert "x" not in registry and SYSTEM_SETTINGS.of("x") is None  # nothing half-registered
