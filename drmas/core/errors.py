"""`naming_key`: an input error with the config key it concerns in front of its message.

A loader reports the file and line at fault; the user also needs to know which setting named that file
(`task.train_file`, `retrieval.corpus`, `eval.benchmarks.<name>`). Every subsystem that reads a configured
path adds the key the same way, here.
"""

from __future__ import annotations


def naming_key(key: str, error: Exception) -> Exception:
    """`error` again, its message prefixed with `key`: of the same type where that type is built from a message
    alone (FileNotFoundError, ValueError, subclasses such as CorpusError), else of the nearest such base
    (`json.JSONDecodeError` and `UnicodeDecodeError` take more arguments and become ValueError), so callers
    that catch the original kind still catch it."""
    message = f"{key}: {error}"
    try:
        return type(error)(message)
    except TypeError:
        return FileNotFoundError(message) if isinstance(error, FileNotFoundError) else ValueError(message)
