"""Trace readers and writers: every supported format becomes ``list[Request]``, sorted by arrival.

One module per format (each documents its assumptions and typing rules), one registry here:

- ``skv``: the native JSONL format (:mod:`skv.traces.native`), lossless for every field;
- ``mooncake``: Kimi's Mooncake JSONL (:mod:`skv.traces.mooncake`);
- ``claude_code``: kv-cache-tester Claude Code sessions (:mod:`skv.traces.claude_code`);
- ``azure2023``: Azure LLM inference CSV (:mod:`skv.traces.azure`);
- ``bailian``: Qwen-Bailian JSONL (:mod:`skv.traces.bailian`).

Plus a libCacheSim ``oracleGeneral`` writer (:mod:`skv.traces.oracle_general`), ``trace_info``
(:mod:`skv.traces.info`) and a binary cache of parsed traces (:mod:`skv.traces.parsed_cache`).

Every reader checks lengths before anything is sized by them: a prompt or an output of more than
:data:`MAX_TOKENS` (2**24 = 16,777,216) tokens, a negative arrival time or a negative hash id is
an error naming ``file:line: field`` (reasons in :mod:`skv.traces.limits`).

Real traces are not part of the project. :func:`trace_dir` finds them (``SKV_TRACE_DIR``, else
``../shared/traces`` beside the repository) and :func:`find_trace` resolves a relative name
there, or says where to download it from.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skv.model import Request
from skv.traces._common import UTF8_BOM, PathLike
from skv.traces.azure import load_azure2023
from skv.traces.bailian import load_bailian
from skv.traces.claude_code import load_claude_code
from skv.traces.errors import TraceFormatError
from skv.traces.info import format_info, trace_info
from skv.traces.limits import MAX_TOKENS
from skv.traces.mooncake import load_mooncake
from skv.traces.native import load_skv, read_skv_header, read_skv_trace, write_skv_trace
from skv.traces.oracle_general import read_oracle_general, write_oracle_general

log = logging.getLogger(__name__)

__all__ = [
    "FORMATS",
    "MAX_TOKENS",
    "UPSTREAMS",
    "TraceFormat",
    "TraceFormatError",
    "detect_format",
    "find_trace",
    "format_info",
    "load_azure2023",
    "load_bailian",
    "load_claude_code",
    "load_mooncake",
    "load_skv",
    "load_trace",
    "read_oracle_general",
    "read_skv_header",
    "read_skv_trace",
    "trace_dir",
    "trace_info",
    "write_oracle_general",
    "write_skv_trace",
]


@dataclass(frozen=True, slots=True)
class TraceFormat:
    """A registered format: its loader (``load(path, **options)``) and a one-line description."""

    name: str
    load: Callable[..., list[Request]]
    description: str

    def __call__(self, path: PathLike, **options: Any) -> list[Request]:
        return self.load(path, **options)


FORMATS: dict[str, TraceFormat] = {
    f.name: f
    for f in (
        TraceFormat("skv", load_skv, "native skv JSONL (header line + one request per line)"),
        TraceFormat("mooncake", load_mooncake, "Mooncake JSONL, 512-token hash ids"),
        TraceFormat("claude_code", load_claude_code, "kv-cache-tester Claude Code session JSON(s)"),
        TraceFormat("azure2023", load_azure2023, "Azure LLM inference CSV (no content)"),
        TraceFormat("bailian", load_bailian, "Qwen-Bailian JSONL, 16-token hash ids"),
    )
}

#: Where each trace family under the trace directory comes from.
UPSTREAMS: dict[str, str] = {
    "mooncake": "https://github.com/kvcache-ai/Mooncake (FAST25-release/traces/)",
    "azure2023": "https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceTrace_*.csv)",
    "weka_cc": "https://github.com/callanjfox/kv-cache-tester (traces/)",
    "bailian": "https://github.com/alibaba-edu/qwen-bailian-usagetraces-anon",
}

#: detect_format parses the first line as JSON up to this size, else sniffs key names.
_FIRST_LINE_LIMIT = 16 << 20
_SNIFF_CHARS = 1 << 16


def detect_format(path: PathLike) -> str:
    """The registry name of a trace, decided by content (not by file name).

    A directory holding ``trace_*.json`` is ``claude_code``. A file is read from its start: an
    ``skv_trace`` header, the keys of the first JSON object, or the CSV header decide.
    """
    p = Path(path)
    if p.is_dir():
        if any(p.glob("trace_*.json")):
            return "claude_code"
        raise TraceFormatError(p, "cannot detect format: directory has no trace_*.json files")
    with open(p, "rb") as f:
        first_raw = b""
        while not first_raw.strip():
            first_raw = f.readline(_FIRST_LINE_LIMIT)
            if not first_raw:
                break
            first_raw = first_raw.removeprefix(UTF8_BOM)  # a byte order mark is not content
    first = first_raw.decode("utf-8", errors="replace").strip()
    if first.startswith("{"):
        try:
            obj = json.loads(first)
            keys = set(obj) if isinstance(obj, dict) else set()
        except json.JSONDecodeError:
            # a pretty-printed document, or a line longer than the limit: sniff key names
            with open(p, "rb") as f:
                head = f.read(_SNIFF_CHARS).removeprefix(UTF8_BOM).decode("utf-8", "replace")
            keys = set(re.findall(r'"(\w+)"\s*:', head))
        if "skv_trace" in keys:
            return "skv"
        if {"chat_id", "hash_ids"} <= keys:
            return "bailian"
        if {"timestamp", "input_length", "hash_ids"} <= keys:
            return "mooncake"
        if "hash_id_scope" in keys or {"block_size", "requests"} <= keys:
            return "claude_code"
    elif "ContextTokens" in first and "GeneratedTokens" in first:
        return "azure2023"
    raise TraceFormatError(
        p,
        "cannot detect trace format; name it with --format (skv CLI) or fmt= (Python), one of "
        + ", ".join(FORMATS),
    )


def load_trace(
    path: PathLike, fmt: str | None = None, *, cache_dir: PathLike | None = None, **options: Any
) -> list[Request]:
    """Load any supported trace as requests sorted by arrival.

    ``path`` may be a relative name under :func:`trace_dir`
    (``"mooncake/conversation_trace.jsonl"``) when it does not exist as given. ``fmt`` defaults
    to :func:`detect_format`; ``options`` go to the format's loader (e.g.
    ``session_interval_s=``, ``seed=`` for ``claude_code``). With ``cache_dir``, a load whose
    source files, format, options and readers match an earlier one is read from that
    directory's binary cache instead of parsed (:mod:`skv.traces.parsed_cache`).
    """
    p = Path(path)
    if not p.exists():
        if p.is_absolute():
            raise FileNotFoundError(f"no such file: {p}")
        try:
            p = find_trace(str(path))
        except FileNotFoundError as exc:
            # the path as typed comes first: most often it is a typo, not a missing download
            raise FileNotFoundError(
                f"no such file: {path} (relative to {Path.cwd()}); "
                f"also looked under the trace directory: {exc}"
            ) from None
    name = fmt or detect_format(p)
    try:
        loader = FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown trace format {name!r}; known: {', '.join(FORMATS)}") from None
    log.debug("loading %s as %s", p, name)
    if cache_dir is not None:
        from skv.traces.parsed_cache import cached_load

        return cached_load(p, name, loader, options, Path(cache_dir))
    return loader(p, **options)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def trace_dir() -> Path | None:
    """Where real traces live: ``$SKV_TRACE_DIR``, else ``../shared/traces`` beside the repo.

    Returns None when neither is available (then real-trace tests and notebooks skip).
    """
    env = os.environ.get("SKV_TRACE_DIR")
    if env:
        return Path(env).expanduser()
    default = _repo_root().parent / "shared" / "traces"
    return default if default.is_dir() else None


def find_trace(name: str) -> Path:
    """Resolve a trace name like ``"mooncake/conversation_trace.jsonl"`` under :func:`trace_dir`.

    Raises FileNotFoundError telling the user where to put the file and where to download it.
    """
    root = trace_dir()
    if root is not None:
        candidate = root / name
        if candidate.exists():
            return candidate
    family = Path(name).parts[0] if Path(name).parts else name
    upstream = UPSTREAMS.get(family)
    source = (
        f"download it from {upstream}"
        if upstream
        else "known sources: " + "; ".join(f"{k}: {v}" for k, v in UPSTREAMS.items())
    )
    if root is None:
        where = (
            "no trace directory: set SKV_TRACE_DIR or create "
            f"{_repo_root().parent / 'shared' / 'traces'}"
        )
    else:
        where = f"not found under trace directory {root}"
    raise FileNotFoundError(f"trace {name!r} {where}; {source} and place it at <trace dir>/{name}")
