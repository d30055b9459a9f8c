"""Process-level helpers for the long loops (replay, simulation, workload generation)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a long loop.

    Replays and generators allocate millions of small objects that stay alive (traces, blocks,
    chats); each collection would walk all of them again, so time would grow faster than the
    work. Nothing piles up meanwhile: what these loops drop is freed by reference counting.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
