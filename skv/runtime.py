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


@contextmanager
def long_lived() -> Iterator[None]:
    """Build data that lives until the process ends (a loaded trace) without the cyclic
    collector, then freeze it (``gc.freeze``): later collections skip it.

    A parsed 20x Claude Code trace holds 112.8M list slots; every full collection walked them
    all again (about 6 of the 33 s of ``traces info`` on it), and so did the first collection
    after :func:`no_cyclic_gc` ends. Frozen objects are still freed by reference counting when
    dropped; only a reference cycle among them would outlive its use, and traces have none.
    """
    with no_cyclic_gc():
        yield
        gc.freeze()


@contextmanager
def existing_objects_frozen() -> Iterator[None]:
    """Run a loop with everything that exists on entry (its input: a trace, requests, caches)
    left out of cyclic collections (``gc.freeze``), so a collection inside scans only what the
    loop creates, and cyclic garbage the loop makes is still collected (unlike
    :func:`no_cyclic_gc`, for loops whose garbage may hold cycles). On exit the frozen objects
    go back to the oldest generation. Does nothing when the process froze objects of its own
    (unfreezing would release those too)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
