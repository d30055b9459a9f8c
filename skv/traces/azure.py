"""Azure LLM inference trace 2023 (Splitwise): CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Upstream: github.com/Azure/AzurePublicDataset (``AzureLLMInferenceTrace_{code,conv}.csv``).

The trace has arrival times and lengths only, no content. Each request therefore gets a single
``UNKNOWN`` segment whose ``content_hash`` is unique to the request (file stem + line), so no
two requests ever share a block: the trace exercises arrival process and lengths (prefill load,
capacity pressure), never reuse. ``arrival_s`` is seconds after the earliest row (the first row
in the published files). Timestamps look like ``2023-11-16 18:17:03.9799600`` (7 fractional
digits, which ``datetime.fromisoformat`` does not accept), so they are parsed by hand; a plain
number is taken as seconds. ``ContextTokens`` and ``GeneratedTokens`` are integers in
``[0, MAX_TOKENS]`` (2**24, see :mod:`skv.traces.limits`); anything else is an error naming
``file:line: column``.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from skv.model import Request, Segment, SemanticType, content_hash
from skv.traces._common import PathLike, sort_by_arrival
from skv.traces.errors import TraceFormatError
from skv.traces.limits import MAX_TOKENS, MAX_TOKENS_REASON

log = logging.getLogger(__name__)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_timestamp(text: str) -> tuple[int, float]:
    """(whole seconds, fraction) of a wall-clock timestamp or a plain number of seconds.

    Kept in two parts so differences between nearby timestamps stay exact to the microsecond.
    """
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        whole_s = math.floor(value)
        return whole_s, value - whole_s
    whole, _, frac = text.partition(".")
    dt = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    seconds = dt.toordinal() * 86400 + dt.hour * 3600 + dt.minute * 60 + dt.second
    if not frac:
        return seconds, 0.0
    if not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    return seconds, int(frac) / 10 ** len(frac)


def _int_field(row: dict[str, str], name: str, path: PathLike, lineno: int) -> int:
    raw = row.get(name)
    try:
        value = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceFormatError(
            path, f"expected a non-negative integer, got {raw!r}", line=lineno, field=name
        ) from None
    if value < 0:
        raise TraceFormatError(
            path, f"expected a non-negative integer, got {raw!r}", line=lineno, field=name
        )
    if value > MAX_TOKENS:
        raise TraceFormatError(
            path,
            f"{value} tokens, over {MAX_TOKENS}; {MAX_TOKENS_REASON}",
            line=lineno,
            field=name,
        )
    return value


def _utf8_lines(f: Iterable[str], path: PathLike) -> Iterator[str]:
    """The file's lines; a byte that is not UTF-8 is an error naming the file and line (the
    csv module's ``line_num`` counts records, so the line is counted here)."""
    lineno = 0
    try:
        for lineno, line in enumerate(f, start=1):  # noqa: B007 (read in the except)
            yield line
    except UnicodeDecodeError as err:
        raise TraceFormatError(path, f"not UTF-8 text: {err}", line=lineno + 1) from None


def load_azure2023(path: PathLike) -> list[Request]:
    """Read an Azure 2023 CSV into requests sorted by arrival (see module docstring)."""
    stem = Path(path).stem
    rows: list[tuple[int, tuple[int, float], int, int]] = []
    with open(path, newline="", encoding="utf-8-sig") as f:  # a leading BOM is skipped
        reader = csv.DictReader(_utf8_lines(f, path))
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(
                path, f"CSV header lacks {', '.join(missing)} (has {reader.fieldnames})", line=1
            )
        for row in reader:
            lineno = reader.line_num
            if None in row:  # more cells than header columns
                raise TraceFormatError(path, "too many columns", line=lineno)
            try:
                ts = parse_timestamp(row["TIMESTAMP"] or "")
            except ValueError as err:
                raise TraceFormatError(
                    path,
                    f"bad timestamp {row['TIMESTAMP']!r}: {err}",
                    line=lineno,
                    field="TIMESTAMP",
                ) from None
            ctx = _int_field(row, "ContextTokens", path, lineno)
            gen = _int_field(row, "GeneratedTokens", path, lineno)
            rows.append((lineno, ts, ctx, gen))
    t0_s, t0_f = min((r[1] for r in rows), default=(0, 0.0))
    requests = []
    for lineno, ts, ctx, gen in rows:
        rid = f"{stem}:{lineno}"
        requests.append(
            Request(
                request_id=rid,
                arrival_s=(ts[0] - t0_s) + (ts[1] - t0_f),
                segments=[
                    Segment(
                        SemanticType.UNKNOWN, ctx, content_hash=content_hash(f"azure2023|{rid}")
                    )
                ],
                output_tokens=gen,
            )
        )
    log.info("azure2023: %d requests from %s", len(requests), path)
    return sort_by_arrival(requests)
