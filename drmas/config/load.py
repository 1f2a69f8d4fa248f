"""Read a config: schema defaults <- YAML file <- `key=value` overrides, then validate (`read_config`).

Every mistake is reported before any work starts, naming the offending key (with the closest valid key
for a typo) or the impossible value, so a long run never dies an hour in on a config error.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from drmas.config.errors import ConfigError
from drmas.config.schema import DrmasConfig
from drmas.config.sections import SECTIONS
from drmas.config.validate import validate_config


@dataclass(frozen=True)
class PluginSpec:
    """One entry of `plugins`: its key (``plugins[1]``), the text as written, and what to import (a module name,
    or the absolute path of a .py file)."""

    key: str
    written: str
    target: str

    @property
    def is_file(self) -> bool:
        return is_plugin_path(self.target)


@dataclass(frozen=True)
class Layer:
    """One source of settings, applied in order over the schema's defaults: the YAML file, then the command
    line. `plugins`: its `plugins` entries (None: it sets none), whose targets replace them in `data`."""

    origin: str
    data: dict
    plugins: Optional[list[PluginSpec]] = None


def read_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DrmasConfig:
    """An optional YAML file plus dotted `key=value` overrides, parsed and validated into a DrmasConfig: nothing
    is imported and no registered name is checked (the config package imports no code it configures). The run's
    config is `drmas.assembly.load_config`'s, which imports the config's plugins first and checks those names.

    Without the plugins, a `system` or `task` section naming a name no imported module registered is kept as its
    name alone (its other keys unchecked); `drmas.assembly.load_config` reports the name."""
    return build_config(read_layers(path, overrides))


def read_layers(path: str | Path | None = None, overrides: Sequence[str] = ()) -> list[Layer]:
    """The YAML file's and the command line's settings, each a mapping; relative plugin paths are made absolute
    (relative to the config file's directory, or to the working directory on the command line), so a config
    written out again (the launcher's `<output_dir>/config.yaml`) imports the same files from anywhere."""
    sources: list[tuple[str, dict, Path]] = []
    if path is not None:
        sources.append((str(path), _read_yaml(Path(path)), Path(path).resolve().parent))
    if overrides:
        sources.append(("command line", _parse_overrides(overrides), Path.cwd()))
    layers = []
    for origin, data, base in sources:
        plugins = _plugins_of(origin, data["plugins"], base) if "plugins" in data else None
        if plugins is not None:
            data = {**data, "plugins": [spec.target for spec in plugins]}
        layers.append(Layer(origin, data, plugins))
    return layers


def plugin_specs(layers: Sequence[Layer]) -> list[PluginSpec]:
    """The `plugins` list the layers resolve to (the last layer that sets it wins, as for every list)."""
    found: list[PluginSpec] = []
    for layer in layers:
        if layer.plugins is not None:
            found = layer.plugins
    return found


def is_plugin_path(spec: str) -> bool:
    """Whether a `plugins` entry names a file (``./my_mas.py``, ``/abs/x.py``) rather than a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def _plugins_of(origin: str, raw: Any, base: Path) -> list[PluginSpec]:
    raw = [] if raw is None else raw
    if not isinstance(raw, list) or not all(isinstance(item, str) and item.strip() for item in raw):
        raise ConfigError(f"{origin}: bad value for 'plugins': expected a list of module names or .py file paths, "
                          f"got {raw!r}")
    return [PluginSpec(f"plugins[{i}]", item.strip(),
                       str((base / item.strip()).resolve()) if is_plugin_path(item.strip()) else item.strip())
            for i, item in enumerate(raw)]


def build_config(layers: Sequence[Layer]) -> DrmasConfig:
    """The layers merged over the schema's defaults, `system` and `task` typed by the settings class their
    name selects (`drmas.config.sections`), then validated."""
    chosen = _section_classes(layers)
    classes = {section: cls for section, (_, cls) in chosen.items()}
    merged = OmegaConf.structured(DrmasConfig)
    for section, cls in classes.items():
        if OmegaConf.get_type(merged, section) is not cls:
            merged[section] = OmegaConf.structured(cls)
    for layer in layers:
        data = _drop_other_settings(layer.data, classes)
        _check_keys(data, DrmasConfig, prefix="", origin=layer.origin, sections=chosen)
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or "?"
            raise ConfigError(f"{layer.origin}: bad value for '{key}': {_first_line(exc)}") from None
        except TypeError:  # OmegaConf's "Cannot merge incompatible container types" names no key: find it
            key, expected, got = _container_mismatch(data, merged) or ("?", "another type", "a container")
            raise ConfigError(f"{layer.origin}: bad value for '{key}': expected {expected}, got {got}") from None
    cfg: DrmasConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    validate_config(cfg)
    return cfg


def _section_classes(layers: Sequence[Layer]) -> dict[str, tuple[Any, type]]:
    """`system` and `task` -> (the name the layers give them, its settings class: the base class when no
    imported module registered that name, and the section then holds its name alone)."""
    defaults = DrmasConfig()
    classes = {}
    for section, registry in SECTIONS.items():
        name = getattr(defaults, section).name
        for layer in layers:
            value = layer.data.get(section)
            if isinstance(value, dict) and "name" in value:
                name = value["name"]
        classes[section] = (name, registry.of(name) or registry.base)
    return classes


def _drop_other_settings(data: dict, classes: dict[str, type]) -> dict:
    """`data` without the keys of `system`/`task` that belong to another registered system/task than the one
    chosen (a config written for one system may switch `system.name` on the command line, as before every
    system had its own settings) and, for a name nothing registered, without any key but `name`."""
    out = dict(data)
    for section, cls in classes.items():
        value = data.get(section)
        if not isinstance(value, dict):
            continue
        registry = SECTIONS[section]
        own = {f.name for f in dataclasses.fields(cls)}
        unknown_name = cls is registry.base
        out[section] = {key: item for key, item in value.items()
                        if key in own or not (unknown_name or registry.owners(str(key)))}
    return out


def to_yaml(cfg: DrmasConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _container_mismatch(data: dict, node: DictConfig, prefix: str = "") -> Optional[tuple[str, str, str]]:
    """(key, expected, got) of the first list given where the schema has a mapping, or the reverse."""
    kinds = {dict: "a mapping", list: "a list"}
    for key, value in data.items():
        if not isinstance(key, str) or key not in node:
            continue
        target, path = node[key], f"{prefix}{key}"
        if isinstance(value, list) and isinstance(target, DictConfig):
            return path, kinds[dict], kinds[list]
        if isinstance(value, dict) and isinstance(target, ListConfig):
            return path, kinds[list], kinds[dict]
        if isinstance(value, dict) and isinstance(target, DictConfig):
            found = _container_mismatch(value, target, f"{path}.")
            if found:
                return found
    return None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}{_nearest_file(path)}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _nearest_file(path: Path) -> str:
    """` (did you mean DIR/NAME?)` for the YAML file beside `path` whose name is closest (`smoke.yml` ->
    `smoke.yaml`), or nothing."""
    try:  # compared by stem: every candidate ends in .yaml, which alone would make any two names look close
        stems = {p.stem: p.name for p in path.parent.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()}
    except OSError:  # no such directory (or unreadable): nothing to suggest
        return ""
    close = difflib.get_close_matches(path.stem, stems, n=1)
    return f" (did you mean {path.parent / stems[close[0]]}?)" if close else ""


def _parse_overrides(overrides: Sequence[str]) -> dict:
    """`a.b=1` strings -> nested dict; values are parsed as YAML scalars (1, true, null, [1, 2])."""
    out: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of '{part}'")
        node[parts[-1]] = value
    return out


def _check_keys(data: Any, schema: type, prefix: str, origin: str,
                sections: Optional[dict[str, tuple[Any, type]]] = None, label: str = "") -> None:
    """Reject keys the schema does not know, suggesting the closest valid one. `sections`: the chosen name and
    settings class of `system` and `task` (top level only); `label` says whose settings `schema` is."""
    if not isinstance(data, dict):
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"{origin}: unknown config key '{full}'{hint}; valid keys {label}here: {valid}")
        if sections and key in sections:
            name, cls = sections[key]
            _check_keys(value, cls, f"{full}.", origin, label=f"of {key} {name!r} ")
            continue
        sub = _dataclass_of(hints[key])
        if sub is not None:
            _check_keys(value, sub, f"{full}.", origin)
        elif typing.get_origin(hints[key]) is dict and isinstance(value, dict):
            item_type = _dataclass_of(typing.get_args(hints[key])[1])
            if item_type is not None:
                for name, item in value.items():
                    _check_keys(item, item_type, f"{full}.{name}.", origin)


def _dataclass_of(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) is typing.Union:  # Optional[Dataclass]
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def chosen_names(layers: Sequence[Layer]) -> dict[str, str]:
    """The system and task the layers choose (`system.name`, `task.name`; the schema's default where none does)."""
    chosen = {section: getattr(DrmasConfig(), section).name for section in SECTIONS}
    for layer in layers:
        for section in SECTIONS:
            value = layer.data.get(section)
            if isinstance(value, Mapping) and isinstance(value.get("name"), str):
                chosen[section] = value["name"]
    return chosen


def iter_help(schema: type = DrmasConfig, prefix: str = "",
              only: Optional[Mapping[str, str]] = None) -> list[tuple[str, str, str]]:
    """(key, default, help) of every leaf field, for `drmas config keys`; under `system` and `task`, the settings
    of every registered system and task (`only`: of the one it names per section), their help prefixed with the
    name that takes them ("[search] ...")."""
    rows = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if schema is DrmasConfig and f.name in SECTIONS:
            rows.extend(_section_help(f.name, (only or {}).get(f.name)))
            continue
        sub = _dataclass_of(hints[f.name])
        if sub is not None:
            rows.extend(iter_help(sub, f"{prefix}{f.name}."))
            continue
        if typing.get_origin(hints[f.name]) is dict:
            item = _dataclass_of(typing.get_args(hints[f.name])[1])
            if item is not None:
                rows.append((f"{prefix}{f.name}", "{}", f.metadata.get("help", "")))
                rows.extend(iter_help(item, f"{prefix}{f.name}.<{f.name[:-1]}>."))
                continue
        rows.append((f"{prefix}{f.name}", _default(f), f.metadata.get("help", "")))
    return rows


def _section_help(section: str, only: Optional[str] = None) -> list[tuple[str, str, str]]:
    registry = SECTIONS[section]
    name = dataclasses.fields(registry.base)[0]
    rows = [(f"{section}.name", repr(getattr(DrmasConfig(), section).name), name.metadata.get("help", ""))]
    for registered in registry.names():
        if only is not None and registered != only:
            continue
        cls = registry.of(registered)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "name":
                continue
            nested = _dataclass_of(hints[f.name])  # a section embedded in the settings (a plugin's system.sandbox)
            own = iter_help(nested, f"{section}.{f.name}.") if nested else [(f"{section}.{f.name}", _default(f),
                                                                              f.metadata.get("help", ""))]
            rows.extend((key, default, f"[{registered}] {text}") for key, default, text in own)
    return rows


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    return repr(f.default_factory())  # type: ignore[misc]
