"""Export block accesses as a libCacheSim ``oracleGeneral`` binary trace.

Why: libCacheSim has fast, well-tested implementations of dozens of eviction policies
(LRU, ARC, S3-FIFO, Belady...). Writing our block accesses in its format gives an independent
baseline for ``skv``'s own simulator (block-level, without prefix-tree semantics).

Record layout (libCacheSim ``oracleGeneralBin.h``: 24 bytes, little-endian, packed)::

    struct { uint32_t clock_time; uint64_t obj_id; uint32_t obj_size; int64_t next_access_vtime; }

i.e. ``struct.Struct("<IQIq")``. One record per block access, requests in the given order and
blocks in prompt order. Keys come from :func:`skv.blocks.request_blocks` (so ``mode`` and the
block size mean the same as in the simulator). ``obj_size`` is the block's tokens times
``bytes_per_token`` (1: sizes in tokens). ``clock_time`` is ``floor(arrival_s / time_unit_s)``
(libCacheSim's convention is seconds).

``next_access_vtime`` follows libCacheSim's own converter (``traceConvOracleGeneral.cpp``,
"reference count starts with 1"): the 1-based position of the next access to the same object,
i.e. its 0-based record index + 1, and -1 when there is none. The tests check this against
``libcachesim``'s converter on the same access sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from skv.blocks import DEFAULT_BLOCK_SIZE, KeyingMode, RequestBlocks, request_blocks
from skv.fileio import atomic_write
from skv.model import Request
from skv.traces._common import PathLike

log = logging.getLogger(__name__)

ORACLE_DTYPE = np.dtype(
    [("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")]
)
assert ORACLE_DTYPE.itemsize == 24

_U32 = (1 << 32) - 1


def oracle_records(
    requests: Iterable[Request | RequestBlocks],
    *,
    block_size: int | None = None,
    mode: KeyingMode | str = KeyingMode.PREFIX,
    bytes_per_token: int = 1,
    time_unit_s: float = 1.0,
    salt_by_tenant: bool = False,
) -> np.ndarray:
    """The records as a structured array with dtype :data:`ORACLE_DTYPE`.

    Items may be requests (keyed here with ``block_size``/``mode``/``salt_by_tenant``) or
    already compiled :class:`RequestBlocks` (``skv.replay.compile_trace``), used as they are.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    if time_unit_s <= 0:
        raise ValueError(f"time_unit_s must be > 0, got {time_unit_s}")
    times: list[int] = []
    keys: list[int] = []
    sizes: list[int] = []
    for i, item in enumerate(requests):
        if isinstance(item, RequestBlocks):
            rb = item
            name = f"#{rb.index}"
        else:
            bs = item.hash_block_size if item.hash_ids is not None else None
            rb = request_blocks(
                item,
                bs or block_size or DEFAULT_BLOCK_SIZE,
                mode,
                index=i,
                salt_by_tenant=salt_by_tenant,
            )
            name = item.request_id
        ts = int(rb.arrival_s // time_unit_s)
        if not 0 <= ts <= _U32:
            raise ValueError(
                f"request {name}: clock_time {ts} does not fit uint32 "
                f"(arrival_s={rb.arrival_s}, time_unit_s={time_unit_s})"
            )
        n = rb.num_blocks
        times.extend([ts] * n)
        keys.extend(rb.keys)
        sizes.extend(t * bytes_per_token for t in rb.tokens)
    rec = np.empty(len(keys), dtype=ORACLE_DTYPE)
    rec["clock_time"] = np.asarray(times, dtype=np.uint64)
    rec["obj_id"] = np.asarray(keys, dtype=np.uint64)
    size_arr = np.asarray(sizes, dtype=np.uint64)
    if size_arr.size and int(size_arr.max()) > _U32:
        raise ValueError(
            f"obj_size {int(size_arr.max())} does not fit uint32; lower bytes_per_token"
        )
    rec["obj_size"] = size_arr
    rec["next_access_vtime"] = next_access_vtimes(rec["obj_id"])
    return rec


def next_access_vtimes(obj_ids: np.ndarray) -> np.ndarray:
    """For each access, 1 + index of the next access to the same id, or -1 (vectorised)."""
    n = len(obj_ids)
    out = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return out
    order = np.argsort(obj_ids, kind="stable")  # same id: increasing index
    ids_sorted = obj_ids[order]
    same = ids_sorted[1:] == ids_sorted[:-1]
    out[order[:-1][same]] = order[1:][same] + 1
    return out


def write_oracle_general(
    path: PathLike,
    requests: Iterable[Request | RequestBlocks],
    *,
    block_size: int | None = None,
    mode: KeyingMode | str = KeyingMode.PREFIX,
    bytes_per_token: int = 1,
    time_unit_s: float = 1.0,
    salt_by_tenant: bool = False,
) -> int:
    """Write the oracleGeneral file atomically; returns the number of records (block accesses).

    ``block_size`` applies to requests without trace hash ids (default 16); hash-id requests
    always use their trace's block size. Compiled :class:`RequestBlocks` are written as given.
    """
    rec = oracle_records(
        requests,
        block_size=block_size,
        mode=mode,
        bytes_per_token=bytes_per_token,
        time_unit_s=time_unit_s,
        salt_by_tenant=salt_by_tenant,
    )
    with atomic_write(path, binary=True) as f:
        f.write(rec.tobytes())
    log.info("wrote %d oracleGeneral records to %s", len(rec), path)
    return len(rec)


def read_oracle_general(path: PathLike) -> np.ndarray:
    """Read an oracleGeneral file back as a structured array (for checks and debugging)."""
    data = np.fromfile(path, dtype=np.uint8)
    if data.size % ORACLE_DTYPE.itemsize:
        raise ValueError(f"{path}: size {data.size} is not a multiple of 24-byte records")
    return data.view(ORACLE_DTYPE)
