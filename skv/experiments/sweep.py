"""The sweep executor: independent runs of one function over a list of tasks, in parallel,
results in task order. Every sweep of skv goes through it (``skv run-all``, the cacheroute,
saecache and repurpose studies, and so the pipeline's notebooks that run them).

Where the runs go, by ``dask=`` or else the ``SKV_DASK`` environment variable:

- unset (or empty): ``jobs`` local processes (dask's multiprocessing scheduler); ``jobs=1``, or
  a single task, runs in this process (no pickling, easiest to debug);
- ``local``: a ``distributed.LocalCluster`` of ``jobs`` worker processes (one thread each, no
  memory limit, as the local processes have none), created for this sweep and closed when it
  ends, errors and Ctrl-C included: no state between sweeps and no process left behind, at the
  price of about a second of start-up per sweep;
- ``tcp://HOST:PORT`` (or ``tls://``, with dask's TLS settings): a running Dask scheduler, through
  ``distributed.Client``; its workers decide the parallelism and ``jobs`` is ignored. Workers
  must import the tasks' functions: the same skv version installed on every worker.

Invariants: the result list is in the order of ``tasks`` whatever the mode, the number of
workers or the order they finish in, and a task's result depends only on the task (each run
seeds itself), so a sweep gives identical results (same values, same order) in every mode.
A task that raises surfaces its own exception, with a note naming the sweep and the task. A
sweep started inside a Dask worker runs in that worker (``SKV_DASK`` is inherited by the
workers; a nested cluster would be pointless and a nested LocalCluster cannot start there).

Progress: a tqdm bar on stderr when it is a terminal and the sweep lasts over
``BAR_DELAY_S``; otherwise (notebooks, CI, logs) a ``logging`` line at most every
``progress_every_s``. ``on_result(index, result)``, if given, is called in this process as
each task finishes (in completion order), e.g. to write finished runs before the sweep ends.

``jobs``: ``None`` reads ``SKV_JOBS`` from the environment, else every CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: environment variable naming where sweeps run (see the module docstring)
DASK_ENV = "SKV_DASK"
#: the ``SKV_DASK`` value for a LocalCluster made by the sweep
LOCAL = "local"
#: a sweep shows its progress bar only once it has run this long
BAR_DELAY_S = 2.0
_ADDRESS = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}")


class DaskAddressError(ValueError):
    """No Dask scheduler answers at the address of ``SKV_DASK`` / ``--dask`` (a ValueError:
    the command line reports it in one line, like any bad setting)."""


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


def dask_target(value: str | None = None) -> str | None:
    """Where sweeps run: ``value`` if given, else ``SKV_DASK``. None means local processes;
    otherwise ``"local"`` or a scheduler address, checked here so that a typo fails before
    any run starts."""
    raw = os.environ.get(DASK_ENV) if value is None else value
    raw = (raw or "").strip()
    if not raw:
        return None
    if raw == LOCAL or _ADDRESS.fullmatch(raw):
        return raw
    raise ValueError(
        f"{DASK_ENV} / --dask must be '{LOCAL}' (a LocalCluster on this machine) or a Dask "
        f"scheduler address tcp://HOST:PORT, got {raw!r}"
    )


def runs_in_this_process(n_tasks: int, *, jobs: int | None = None, dask: str | None = None) -> bool:
    """Whether :func:`run_sweep` with these settings runs its tasks in the calling process
    (so per-run progress bars and monkeypatches reach them)."""
    if dask_target(dask) is not None and not _inside_dask_worker():
        return n_tasks == 0
    return (default_jobs() if jobs is None else jobs) == 1 or n_tasks <= 1


def _inside_dask_worker() -> bool:
    if "distributed" not in sys.modules:
        return False
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def _describe(task: Any, limit: int = 200) -> str:
    text = repr(task)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call(fn: Callable[[T], R], task: T, index: int, total: int, label: str) -> R:
    """``fn(task)``; an exception leaves with a note naming the task (notes travel with the
    exception's pickle, so this holds in every mode)."""
    try:
        return fn(task)
    except Exception as exc:
        exc.add_note(f"{label}: task {index + 1} of {total} failed: {_describe(task)}")
        raise


class _Progress:
    """Counts finished tasks (always in this process) for a bar on a terminal, else logs."""

    def __init__(self, label: str, total: int, every_s: float, bar: bool | None) -> None:
        self.label, self.total, self.every_s = label, total, every_s
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.bar: Any = None
        self.redirect = contextlib.ExitStack()
        if bar is None:
            bar = sys.stderr.isatty()
        if bar and total > 1:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(total=total, desc=label, unit="run", delay=BAR_DELAY_S, file=sys.stderr)
            # log lines during the sweep (finished runs) print above the bar, not through it
            self.redirect.enter_context(logging_redirect_tqdm(tqdm_class=tqdm))

    def tick(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(1)
            if self.done == self.total:
                self.bar.close()  # before the closing log line, not under it
        if self.done == self.total or (self.bar is None and now - self.last >= self.every_s):
            self.last = now
            log.info("%s: %d/%d runs, %.0f s", self.label, self.done, self.total, now - self.t0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.redirect.close()


def run_sweep(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    *,
    jobs: int | None = None,
    label: str = "sweep",
    dask: str | None = None,
    scheduler: str | Callable | None = None,
    progress_every_s: float = 10.0,
    bar: bool | None = None,
    on_result: Callable[[int, R], None] | None = None,
) -> list[R]:
    """``[fn(t) for t in tasks]``, computed where ``dask`` / ``SKV_DASK`` says (module
    docstring); ``fn`` and the tasks must pickle (a module-level function and plain data).
    ``scheduler`` (any dask scheduler name or a ``Client.get``) overrides ``SKV_DASK``;
    ``bar``: None shows a progress bar on a terminal only."""
    target = dask_target(dask)
    if scheduler is not None and dask is not None:
        raise ValueError("run_sweep: give dask= or scheduler=, not both")
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    tasks = list(tasks)
    if not tasks:
        return []
    if target is not None and _inside_dask_worker():
        log.debug("%s: inside a Dask worker, running its %d tasks here", label, len(tasks))
        target, jobs = None, 1
    progress = _Progress(label, len(tasks), progress_every_s, bar)
    try:
        if scheduler is None and target is not None:
            return _on_cluster(fn, tasks, target, jobs, label, progress, on_result)
        if scheduler is None and (jobs == 1 or len(tasks) == 1):
            out = []
            for i, t in enumerate(tasks):
                out.append(_call(fn, t, i, len(tasks), label))
                if on_result is not None:
                    on_result(i, out[-1])
                progress.tick()
            return out
        return _on_local_scheduler(fn, tasks, scheduler, jobs, label, progress, on_result)
    finally:
        progress.close()


def _on_local_scheduler(
    fn: Callable[[T], R],
    tasks: list[T],
    scheduler: str | Callable | None,
    jobs: int,
    label: str,
    progress: _Progress,
    on_result: Callable[[int, R], None] | None,
) -> list[R]:
    """dask.delayed graph on the multiprocessing scheduler (or ``scheduler``); dask's
    callbacks run in this process as each task finishes."""
    import dask
    from dask.callbacks import Callback

    n = len(tasks)
    graph = [dask.delayed(_call, pure=False)(fn, t, i, n, label) for i, t in enumerate(tasks)]
    index = {d.key: i for i, d in enumerate(graph)}

    def finished(key: Any, result: Any, *_: Any) -> None:
        if key in index:
            if on_result is not None:
                on_result(index[key], result)
            progress.tick()

    with Callback(posttask=finished):
        if scheduler is None:
            results = dask.compute(*graph, scheduler="processes", num_workers=jobs)
        else:
            results = dask.compute(*graph, scheduler=scheduler)
    return list(results)


@contextlib.contextmanager
def _quiet_distributed() -> Iterator[None]:
    """distributed logs every worker start and stop at INFO: keep skv's log readable."""
    logger = logging.getLogger("distributed")
    level = logger.level
    if logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _connect(address: str) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address`` (not dask's default client);
    no answer within dask's connect timeout (``distributed.comm.timeouts.connect``, 30 s
    unless configured) is a :class:`DaskAddressError`."""
    from distributed import Client

    try:
        return Client(address, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise DaskAddressError(
            f"no Dask scheduler answers at {address} ({DASK_ENV} / --dask): {exc}"
        ) from None


def check_dask(value: str | None = None) -> str | None:
    """:func:`dask_target`, and for an address a scheduler that answers: for commands that
    hand ``SKV_DASK`` on to child processes (the pipeline's notebooks), so that a bad setting
    fails once, up front, not in every child."""
    target = dask_target(value)
    if target is not None and target != LOCAL:
        with _quiet_distributed():
            _connect(target).close()
    return target


def _on_cluster(
    fn: Callable[[T], R],
    tasks: list[T],
    target: str,
    jobs: int,
    label: str,
    progress: _Progress,
    on_result: Callable[[int, R], None] | None,
) -> list[R]:
    """Futures on a LocalCluster made here (closed on the way out) or on the scheduler at
    ``target``; results collected as they finish, returned in task order."""
    from distributed import Client, LocalCluster, as_completed

    n = len(tasks)
    with _quiet_distributed(), contextlib.ExitStack() as stack:
        if target == LOCAL:
            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=min(jobs, n),
                    threads_per_worker=1,
                    processes=True,
                    memory_limit=0,
                    dashboard_address=None,
                    silence_logs=logging.CRITICAL,  # task errors reach the client
                )
            )
            client = stack.enter_context(Client(cluster, set_as_default=False))
            log.info("%s: %d tasks on a LocalCluster of %d workers", label, n, min(jobs, n))
        else:
            client = stack.enter_context(_connect(target))
            log.info("%s: %d tasks on the Dask scheduler at %s", label, n, target)
        futures = [
            client.submit(_call, fn, t, i, n, label, pure=False) for i, t in enumerate(tasks)
        ]
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * n
        for fut in as_completed(futures, loop=client.loop):
            i = index[fut.key]
            results[i] = fut.result()  # a task's exception is raised here, with its note
            if on_result is not None:
                on_result(i, results[i])
            progress.tick()
    return results
