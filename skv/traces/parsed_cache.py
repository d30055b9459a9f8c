"""A binary cache of parsed traces: the second load of a large trace skips its parser.

Parsing dominates loading a big trace: the 20x Claude Code scale-up (55,720 requests, 112.8M
block ids in 800 JSON files, ``benchmarks/trace_scale.py``) takes about 15 s to parse. The cache
stores the parsed ``list[Request]`` as one ``.npz`` file of columns and rebuilds it in a
fraction of that.

**Key.** An entry is found by a digest of everything the parsed requests depend on: the
resolved source path, every source file's size and content digest (BLAKE2b; for a directory,
every regular file under it, so an added, removed or edited session file is a miss), the format
name, the loader's options, and the source of the readers (``skv/traces/*.py`` and
``skv/model.py``), so a changed parser never serves old results. Nothing is trusted from file
times. The cache never goes stale; it only grows (delete the directory to reclaim it).

**Layout.** Hash ids are stored the way turns repeat them: each request names its parent (the
previous request of the same session in trace order), how many leading ids it shares with that
parent, and its new ids; a flat ``int64``/``uint64`` array holds only the new ids. So an entry is
proportional to unique blocks plus requests, not to block accesses (the 20x trace: 112.8M ids,
an entry of tens of MB). On load a request's list is its parent's prefix plus its new ids, so,
as with the Claude Code reader itself, a repeated prefix shares its parent's ``int`` objects.
Scalar fields, segments' strings and ``extra`` go in one JSON document; a trace whose fields do
not survive JSON unchanged (a tuple, a non-string key, an id beyond 64 bits) is not cached, and
the load says so at debug level.

Entries are written to a temporary file and renamed into place: an interrupted write leaves no
entry, and concurrent writers of one key write the same bytes. Loaded with
``allow_pickle=False``: an entry is data, never code.

Where: ``$SKV_TRACE_CACHE`` (``off`` disables it), else ``$XDG_CACHE_HOME/skv/traces``, else
``~/.cache/skv/traces``. The CLI uses it by default (``--no-trace-cache``);
:func:`skv.traces.load_trace` only when given ``cache_dir=``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from skv.blocks import common_prefix_len
from skv.model import TYPES, Request, Segment
from skv.runtime import no_cyclic_gc

log = logging.getLogger(__name__)

#: bumped when the layout below changes; part of every key
CACHE_FORMAT = 1
_OFF = {"off", "0", "none", "no", "false"}
_NO_PARENT = -1
_NO_IDS = -2  # the request has no hash ids (content-keyed)
_STYPES = {t: i for i, t in enumerate(TYPES)}
_FIELDS = (
    "request_id",
    "arrival_s",
    "output_tokens",
    "session_id",
    "tenant_id",
    "turn",
    "parent_id",
    "templated",
    "hash_block_size",
    "observed_ttft_ms",
    "observed_cached_tokens",
    "output_hash",
    "extra",
)
_reader_digest: str | None = None


def default_cache_dir() -> Path | None:
    """``$SKV_TRACE_CACHE`` (None when it says ``off``), else the user's cache directory."""
    env = os.environ.get("SKV_TRACE_CACHE")
    if env is not None and env.strip():
        return None if env.strip().lower() in _OFF else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "skv" / "traces"


def cached_load(
    path: Path,
    fmt: str,
    loader: Callable[..., list[Request]],
    options: dict[str, Any],
    directory: Path,
) -> list[Request]:
    """``loader(path, **options)``, served from ``directory`` when an entry matches the key."""
    key = cache_key(path, fmt, options)
    entry = directory / f"{key}.npz"
    if entry.is_file():
        try:
            with no_cyclic_gc():  # millions of new objects: each collection would walk them all
                requests = read_entry(entry)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # a miss
            log.warning("ignoring unreadable trace cache entry %s: %s", entry, exc)
        else:
            log.info("loaded %s from the trace cache (%s)", path, entry)
            return requests
    requests = loader(path, **options)
    try:
        columns = encode(requests)
    except _NotCacheable as why:
        log.debug("not caching %s: %s", path, why)
        return requests
    try:
        write_entry(entry, columns)
    except OSError as exc:  # a full or read-only disk costs the cache, not the load
        log.warning("could not write the trace cache entry %s: %s", entry, exc)
    else:
        log.info("cached the parsed %s in %s", path, entry)
    return requests


def cache_key(path: Path, fmt: str, options: dict[str, Any]) -> str:
    """Digest of the source (path, sizes, contents), format, options and reader code."""
    h = hashlib.blake2b(digest_size=20)
    root = path.resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    head = {
        "cache_format": CACHE_FORMAT,
        "readers": _readers(),
        "path": str(root),
        "format": fmt,
        "options": sorted((k, repr(v)) for k, v in options.items()),
    }
    h.update(json.dumps(head, sort_keys=True).encode())
    for f in files:
        with open(f, "rb") as fh:
            digest = hashlib.file_digest(fh, "blake2b").hexdigest()
        h.update(f"\n{f.relative_to(root).as_posix() if f != root else ''}\0{digest}".encode())
    return h.hexdigest()


def _readers() -> str:
    """Digest of the readers' source: a changed parser gets new keys."""
    global _reader_digest
    if _reader_digest is None:
        pkg = Path(__file__).resolve().parent
        h = hashlib.blake2b(digest_size=16)
        for f in [*sorted(pkg.glob("*.py")), pkg.parent / "model.py"]:
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        _reader_digest = h.hexdigest()
    return _reader_digest


class _NotCacheable(ValueError):
    """The requests hold something the columns cannot reproduce exactly."""


def encode(requests: Sequence[Request]) -> dict[str, np.ndarray]:
    """The columns of an entry (see module docstring); raises _NotCacheable."""
    n = len(requests)
    parent = np.full(n, _NO_PARENT, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)
    new_count = np.zeros(n, dtype=np.int64)
    new_ids: list[int] = []
    seg_count = np.zeros(n, dtype=np.int64)
    stypes: list[int] = []
    seg_tokens: list[int] = []
    seg_strings: list[list[Any]] = []
    token_id_lens: list[int] = []
    token_ids: list[int] = []
    rows: list[list[Any]] = []
    last: dict[str | None, int] = {}  # session -> index of its latest request
    for i, r in enumerate(requests):
        rows.append([getattr(r, f) for f in _FIELDS])
        seg_count[i] = len(r.segments)
        for s in r.segments:
            stypes.append(_STYPES[s.stype])
            seg_tokens.append(s.num_tokens)
            seg_strings.append([s.content_hash, s.reusable, s.text])
            token_id_lens.append(-1 if s.token_ids is None else len(s.token_ids))
            token_ids.extend(s.token_ids or ())
        ids = r.hash_ids
        if ids is None:
            parent[i] = _NO_IDS
            continue
        j = last.get(r.session_id)
        last[r.session_id] = i
        same = 0
        if j is not None and (prev := requests[j].hash_ids) is not None:
            same = common_prefix_len(prev, ids)
            parent[i] = j
        shared[i] = same
        new_count[i] = len(ids) - same
        new_ids.extend(ids[same:])
    meta = {"format": CACHE_FORMAT, "rows": rows, "segments": seg_strings}
    try:
        text = json.dumps(meta, allow_nan=True)
        same_meta = json.loads(text) == meta
    except (TypeError, ValueError) as exc:
        raise _NotCacheable(str(exc)) from None
    if not same_meta:
        raise _NotCacheable("a field does not survive JSON unchanged (a tuple or non-str key?)")
    return {
        "meta": np.frombuffer(text.encode(), dtype=np.uint8),
        "parent": parent,
        "shared": shared,
        "new_count": new_count,
        "new_ids": _int_column(new_ids, "hash id"),
        "seg_count": seg_count,
        "seg_stype": np.asarray(stypes, dtype=np.uint8),
        "seg_tokens": np.asarray(seg_tokens, dtype=np.int64),
        "token_id_lens": np.asarray(token_id_lens, dtype=np.int64),
        "token_ids": _int_column(token_ids, "token id"),
    }


def _int_column(values: list[int], what: str) -> np.ndarray:
    if not values or (min(values) >= 0 and max(values) < 2**63):
        return np.asarray(values, dtype=np.int64)
    if min(values) >= 0 and max(values) < 2**64:
        return np.asarray(values, dtype=np.uint64)
    raise _NotCacheable(f"a {what} outside 64 bits")


def write_entry(entry: Path, columns: dict[str, np.ndarray]) -> None:
    """Write atomically: a temporary file in the same directory, renamed into place."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{entry.stem}.", suffix=".tmp", dir=entry.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **columns)
        os.replace(tmp, entry)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_entry(entry: Path) -> list[Request]:
    """Rebuild the requests of an entry written by :func:`encode` and :func:`write_entry`."""
    with np.load(entry, allow_pickle=False) as z:
        c = {k: z[k] for k in z.files}
    meta = json.loads(c["meta"].tobytes())
    if meta.get("format") != CACHE_FORMAT:
        raise ValueError(f"entry format {meta.get('format')!r}, expected {CACHE_FORMAT}")
    rows = meta["rows"]
    seg_strings = meta["segments"]
    parent = c["parent"].tolist()
    shared = c["shared"].tolist()
    new_count = c["new_count"].tolist()
    new_ids = c["new_ids"].tolist()
    seg_count = c["seg_count"].tolist()
    stypes = [TYPES[k] for k in c["seg_stype"].tolist()]
    seg_tokens = c["seg_tokens"].tolist()
    token_id_lens = c["token_id_lens"].tolist()
    token_ids = c["token_ids"].tolist()
    if not len(rows) == len(parent) == len(seg_count) or len(stypes) != len(seg_strings):
        raise ValueError("columns of different lengths")
    out: list[Request] = []
    lists: list[list[int] | None] = []
    at_id = at_seg = at_tok = 0
    for i, row in enumerate(rows):
        segments = []
        for _ in range(seg_count[i]):
            chash, reusable, text = seg_strings[at_seg]
            k = token_id_lens[at_seg]
            toks = None
            if k >= 0:
                toks = token_ids[at_tok : at_tok + k]
                at_tok += k
            segments.append(
                Segment(stypes[at_seg], seg_tokens[at_seg], chash, reusable, text, toks)
            )
            at_seg += 1
        p = parent[i]
        if p == _NO_IDS:
            ids = None
        else:
            ids = lists[p][: shared[i]] if p != _NO_PARENT else []  # type: ignore[index]
            m = new_count[i]
            ids += new_ids[at_id : at_id + m]
            at_id += m
        lists.append(ids)
        fields = dict(zip(_FIELDS, row, strict=True))
        out.append(Request(segments=segments, hash_ids=ids, **fields))
    return out
