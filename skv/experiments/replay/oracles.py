"""Independent recomputations of numbers the simulator produces, for claims that check skv.

Each oracle reads the raw file with the standard library only (no skv reader, keying or cache
code), so a bug in those cannot make both sides agree.
"""

from __future__ import annotations

import json
from pathlib import Path


def mooncake_infinite_cache_hit_rate(path: str | Path) -> float:
    """Block hit rate of an infinite prefix cache on a Mooncake hash-id trace.

    Mooncake's ``hash_ids`` are prefix-chained (an id names its whole prefix), so with infinite
    capacity a block hits exactly when its id appeared in an earlier request; requests are
    taken in timestamp order (stable for equal timestamps, as the file lists them).
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                records.append((r["timestamp"], r["hash_ids"]))
    records.sort(key=lambda r: r[0])
    seen: set[int] = set()
    hits = total = 0
    for _, ids in records:
        for h in ids:
            total += 1
            hits += h in seen
        seen.update(ids)
    return hits / total if total else 0.0
