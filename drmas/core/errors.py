"""`naming_key`: an input error with the config key it concerns in front of its message; `Fatal`.

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


class Fatal(RuntimeError):
    """An error that means the process cannot go on, raised where per-item failures are otherwise isolated:
    e.g. a supervised agent program past its restart bound. The episode runner drops an episode whose plugin
    raises anything else, but lets a `Fatal` end the process (the launcher's restart policy then applies)."""
