"""Reading JSON-lines files, with errors that point at the line.

Task files, benchmark files and passage corpora (up to multi-gigabyte Wikipedia dumps) are all jsonl. A
corrupt line in a big file cannot be found without its line number, so every error names `path:LINE`
(1-based); blank lines, which editors and concatenation leave behind, are skipped. msgspec decodes, being
several times faster than the json module on large dumps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import msgspec


def input_file(path: str | Path, what: str, error: type[Exception] = ValueError) -> Path:
    """`path` as a file the user named to be read: FileNotFoundError when it is missing, `error` when it is a
    directory or this process may not read it (a PermissionError traceback said neither which file nor which
    setting; the caller adds the key, see `drmas.core.errors.naming_key`)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a directory, not a file")
    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    return path


def jsonl_records(path: Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """`(where, line_number, record)` for each non-blank line of `path`, where = "path:LINE".

    A line that is not valid JSON, or not a JSON object, raises `error("path:LINE: ...")`; so does a file that
    cannot be read.
    """
    decoder = msgspec.json.Decoder()
    try:
        handle = Path(path).open("rb")
    except OSError as exc:
        raise error(f"{path} cannot be read: {exc.strerror or exc}") from None
    with handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise error(f"{where}: invalid JSON: {exc}") from None
            if not isinstance(record, dict):
                raise error(f"{where}: expected a JSON object, got {_json_type(record)}")
            yield where, line_number, record


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
