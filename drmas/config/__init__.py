"""Configuration: typed schema (schema.py), loading with overrides (load.py), semantic checks (validate.py)."""

from drmas.config.load import ConfigError, iter_help, load_config, to_yaml
from drmas.config.schema import DrmasConfig

__all__ = ["ConfigError", "DrmasConfig", "iter_help", "load_config", "to_yaml"]
