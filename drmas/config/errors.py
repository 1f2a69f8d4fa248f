"""`ConfigError`: a configuration mistake, its message naming the key and what is wrong."""


class ConfigError(ValueError):
    """A configuration mistake; the message names the key and what is wrong."""
