"""The sweep executor: independent runs of one function over a list of tasks, in parallel
processes, results in task order.

Built on dask (``dask.delayed`` and its multiprocessing scheduler), so a sweep is a task graph
that a user with a cluster can hand to ``dask.distributed`` instead (``scheduler=`` takes any
dask scheduler name or a ``Client.get``). Invariants: the result list is in the order of
``tasks`` whatever the number of processes or the order they finish in, and a task's result
depends only on the task (each run seeds itself), so a sweep gives identical results with
``jobs=1`` and ``jobs=8``. Progress is logged (``logging``, at most every ``progress_every_s``).

``jobs``: ``None`` reads ``SKV_JOBS`` from the environment, else every CPU; 1 runs in this
process (no pickling, easiest to debug).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def default_jobs() -> int:
    """``SKV_JOBS`` if set (a positive integer), else the number of CPUs."""
    raw = os.environ.get("SKV_JOBS")
    if raw is None or raw == "":
        return os.cpu_count() or 1
    try:
        jobs = int(raw)
    except ValueError:
        raise ValueError(f"SKV_JOBS must be a positive integer, got {raw!r}") from None
    if jobs < 1:
        raise ValueError(f"SKV_JOBS must be a positive integer, got {raw!r}")
    return jobs


class _Progress:
    """Counts finished tasks (dask's scheduler callbacks run in this process) and logs."""

    def __init__(self, label: str, total: int, every_s: float) -> None:
        self.label, self.total, self.every_s = label, total, every_s
        self.done = 0
        self.t0 = self.last = time.monotonic()

    def tick(self, *_: Any) -> None:
        self.done += 1
        now = time.monotonic()
        if self.done == self.total or now - self.last >= self.every_s:
            self.last = now
            log.info("%s: %d/%d runs, %.0f s", self.label, self.done, self.total, now - self.t0)


def run_sweep(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    *,
    jobs: int | None = None,
    label: str = "sweep",
    scheduler: str | Callable | None = None,
    progress_every_s: float = 10.0,
) -> list[R]:
    """``[fn(t) for t in tasks]``, computed in ``jobs`` processes; ``fn`` and the tasks must
    pickle (a module-level function and plain data)."""
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    progress = _Progress(label, len(tasks), progress_every_s)
    if (jobs == 1 or len(tasks) <= 1) and scheduler is None:
        out = []
        for t in tasks:
            out.append(fn(t))
            progress.tick()
        return out
    import dask
    from dask.callbacks import Callback

    graph = [dask.delayed(fn, pure=False)(t) for t in tasks]
    with Callback(posttask=progress.tick):
        if scheduler is None:
            results = dask.compute(*graph, scheduler="processes", num_workers=jobs)
        else:
            results = dask.compute(*graph, scheduler=scheduler)
    return list(results)
