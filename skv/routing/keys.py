"""Request keys for the routers that route by shared prefix (``consistent_hashing``,
``cacheroute``), and the one integer mixer they hash with.

A request's key is its shared prefix: the hash of the keys of its first ``k`` blocks. Block keys
are ints (``skv.blocks``), and CPython hashes tuples of ints deterministically (no per-process
randomisation), so a key is the same in every run and every process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks

_MASK64 = (1 << 64) - 1


def prefix_key(rb: RequestBlocks, blocks: int) -> int | None:
    """The key of ``rb``'s first ``blocks`` blocks (all of them when it has fewer); None for a
    request without blocks (nothing to share)."""
    if not rb.keys:
        return None
    return hash(tuple(rb.keys[:blocks])) & _MASK64


def mix64(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit int spread over the whole 64-bit range (hash-ring
    points; Python's tuple hash alone clusters for small ints)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)
