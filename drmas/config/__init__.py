"""Configuration: the typed schema and its sections, reading a file with overrides (`read_config`), and the checks
of the values.

Imports nothing of drmas but `drmas.core`: which registered components the names in a config select is
checked where components are built (`drmas.assembly.load_config`, the run's config: it imports the config's
plugins first, then reads it with `read_config` and checks those names). `system.*` and `task.*` are read with the settings class the chosen system or task registered
(`drmas.config.sections`; the built-ins' in `systems.py` and `tasks.py`).
"""

from drmas.config.errors import ConfigError
from drmas.config.load import iter_help, read_config, to_yaml
from drmas.config.schema import DrmasConfig

__all__ = ["ConfigError", "DrmasConfig", "iter_help", "read_config", "to_yaml"]
