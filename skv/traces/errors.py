"""The one error every trace reader raises for bad input, and how pydantic errors become it.

A reader that meets a malformed record must say *where* (file and line, or a JSON path for
whole-document formats) and *which field*, so a user can open the file at that spot. Readers
build their whole output in memory and only return it at the end, so an error never leaves a
caller with a half-read trace; writers go through a temp file for the same reason.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import ValidationError

from skv.traces.limits import MAX_TOKENS, MAX_TOKENS_REASON


class TraceFormatError(ValueError):
    """A trace file (or the data about to be written to one) breaks its format.

    ``str(err)`` reads ``path:line: field: message``; parts that are unknown are left out.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path or "<trace>"
        if line is not None:
            where = f"{where}:{line}"
        text = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(text)


_JSON_POS = re.compile(r" at line (\d+) column (\d+)$")


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<record>"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def from_validation_error(
    err: ValidationError,
    path: str | os.PathLike[str],
    *,
    line: int | None = None,
    prefix: str = "",
) -> TraceFormatError:
    """The first pydantic error as a TraceFormatError (with a count of the others)."""
    errors = err.errors(include_url=False)
    first = errors[0]
    msg = first["msg"]
    if first["type"] == "json_invalid":
        # pydantic says "at line L column C" within the parsed text: for one JSONL record that
        # is noise next to the file line; for a whole document it *is* the file line.
        m = _JSON_POS.search(msg)
        if m:
            msg = msg[: m.start()] + f" (column {m.group(2)})"
            if line is None:
                line = int(m.group(1))
        return TraceFormatError(path, msg.replace("Invalid JSON", "invalid JSON"), line=line)
    field = prefix + _loc(tuple(first["loc"]))
    if first["type"] not in ("missing", "json_invalid") and "input" in first:
        msg = f"{msg} (got {_short(first['input'])})"
    if first["type"] == "less_than_equal" and first.get("ctx", {}).get("le") == MAX_TOKENS:
        msg += f"; {MAX_TOKENS_REASON}"
    if len(errors) > 1:
        msg = f"{msg} (+{len(errors) - 1} more error(s) in this record)"
    return TraceFormatError(path, msg, line=line, field=field or None)
