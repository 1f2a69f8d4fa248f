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


def jsonl_records(path: Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """`(where, line_number, record)` for each non-blank line of `path`, where = "path:LINE".

    A line that is not valid JSON, or not a JSON object, raises `error("path:LINE: ...")`.
    """
    decoder = msgspec.json.Decoder()
    with Path(path).open("rb") as handle:
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
