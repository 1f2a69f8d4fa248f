"""Load a config: schema defaults <- YAML file <- `key=value` overrides, then validate.

Every mistake is reported before any work starts, naming the offending key (with the closest valid key
for a typo) or the impossible value, so a long run never dies an hour in on a config error.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from drmas.config.errors import ConfigError
from drmas.config.schema import DrmasConfig
from drmas.config.validate import validate_config


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DrmasConfig:
    """Resolve the config from an optional YAML file plus dotted `key=value` overrides."""
    layers: list[tuple[str, dict]] = []
    if path is not None:
        layers.append((str(path), _read_yaml(Path(path))))
    if overrides:
        layers.append(("command line", _parse_overrides(overrides)))
    merged = OmegaConf.structured(DrmasConfig)
    for origin, data in layers:
        _check_keys(data, DrmasConfig, prefix="", origin=origin)
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or "?"
            raise ConfigError(f"{origin}: bad value for '{key}': {_first_line(exc)}") from None
        except TypeError:  # OmegaConf's "Cannot merge incompatible container types" names no key: find it
            key, expected, got = _container_mismatch(data, merged) or ("?", "another type", "a container")
            raise ConfigError(f"{origin}: bad value for '{key}': expected {expected}, got {got}") from None
    cfg: DrmasConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    validate_config(cfg)
    return cfg


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
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


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


def _check_keys(data: Any, schema: type, prefix: str, origin: str) -> None:
    """Reject keys the schema does not know, suggesting the closest valid one."""
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
            raise ConfigError(f"{origin}: unknown config key '{full}'{hint}; valid keys here: {valid}")
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


def iter_help(schema: type = DrmasConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) of every leaf field, for `drmas config keys`."""
    rows = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
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
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        else:
            default = repr(f.default_factory())  # type: ignore[misc]
        rows.append((f"{prefix}{f.name}", default, f.metadata.get("help", "")))
    return rows
