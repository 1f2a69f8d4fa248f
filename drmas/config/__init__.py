"""Configuration: the typed schema and its sections, loading with overrides, and the checks of the values.

Imports nothing of drmas but `drmas.core`: which registered components the names in a config select is
checked where components are built (`drmas.assembly.load_config`, which also imports the config's plugins
first). `system.*` and `task.*` are read with the settings class the chosen system or task registered
(`drmas.config.sections`; the built-ins' in `systems.py` and `tasks.py`).
"""

from drmas.config.errors import ConfigError
from drmas.config.load import iter_help, load_config, to_yaml
from drmas.config.schema import DrmasConfig

__all__ = ["ConfigError", "DrmasConfig", "iter_help", "load_config", "to_yaml"]
