"""Writing result and trace files safely: all or nothing.

:func:`atomic_write` for one file, :func:`atomic_dir` for a directory of files (a run's
results, plots and log): an interrupted or failed write never leaves a file or a directory that
looks complete. A writer killed outright (SIGKILL) leaves its hidden staging directory
(``.<name>.<host>-<pid>-<random>.partial``): the next atomic write into the same directory
removes it (:func:`clean_stale_partials`), or names it when its writer cannot be told.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike[str]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_write(path: PathLike, *, binary: bool = False) -> Iterator[IO[Any]]:
    """Write to a temp file beside ``path`` and move it into place only on success.

    On any exception the temp file is removed and ``path`` is left as it was, so a failure never
    leaves a half-written trace behind.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if binary:
            f: IO[Any] = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


#: a staging directory's name: ``.<target>.<host>-<pid>-<random>.partial`` (the writer's host
#: and process id let a later writer tell a dead writer's leftovers from a live one's)
_PARTIAL = re.compile(r"\.(?P<target>.+)\.(?P<host>\w+)-(?P<pid>\d+)-[0-9a-f]{8}\.partial")


def _host() -> str:
    return re.sub(r"\W", "_", socket.gethostname())[:64] or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, someone else's
        return True
    return True


def stale_partials(directory: PathLike) -> tuple[list[Path], list[Path]]:
    """Staging directories in ``directory`` left by interrupted writers (a SIGKILL, a power
    cut: no ``finally`` ran): (those of a process of this host that no longer runs, safe to
    remove; those whose writer cannot be told: another host's, or an older skv's
    ``.<name>.<random>.partial`` without one). A live writer's staging directory is in neither."""
    root = Path(directory)
    dead: list[Path] = []
    unknown: list[Path] = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return dead, unknown
    host = _host()
    for p in entries:
        if not (p.name.startswith(".") and p.name.endswith(".partial")) or not p.is_dir():
            continue
        m = _PARTIAL.fullmatch(p.name)
        if m is None or m["host"] != host:
            unknown.append(p)
        elif int(m["pid"]) != os.getpid() and not _alive(int(m["pid"])):
            dead.append(p)
    return dead, unknown


def clean_stale_partials(directory: PathLike) -> list[Path]:
    """Remove the staging directories of dead writers in ``directory`` (:func:`stale_partials`)
    and warn about each (and about those whose writer cannot be told, left in place: remove
    them by hand once no run writes there). Returns the removed ones."""
    dead, unknown = stale_partials(directory)
    removed = []
    for p in dead:
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p)
            log.warning("removed %s: partial output of an interrupted run (process gone)", p)
    for p in unknown:
        log.warning(
            "%s: partial output of an interrupted run (another host's or an older skv's); "
            "nothing reads it: remove it once no run is writing into %s",
            p,
            p.parent,
        )
    return removed


def staging_dir(target: Path) -> Path:
    """A new, empty hidden directory beside ``target`` (mode from the umask, as ``mkdir``),
    named after this host and process; stale ones of dead writers there are removed first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_partials(target.parent)
    for _ in range(100):
        tag = f"{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp = target.with_name(f".{target.name}.{tag}.partial")
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"cannot create a staging directory beside {target}")


@contextlib.contextmanager
def atomic_dir(path: PathLike, *, last: Sequence[str] = ()) -> Iterator[Path]:
    """Write a directory's files into a hidden staging directory; move them into ``path`` only
    when the block ends without an exception.

    Yields the staging directory (``.<name>.<random>.partial`` beside ``path``, same file
    system). On success it is renamed onto ``path`` in one step when ``path`` is absent or an
    empty directory (a reserved run directory); when ``path`` already holds files (a reused
    ``--output``), each staged entry replaces its namesake, the names in ``last`` at the end,
    so the file a reader takes as "complete" (``results.json``) arrives after all the others.
    On any exception, KeyboardInterrupt included, the staging directory is removed and
    ``path`` is left as it was.
    """
    target = Path(path)
    tmp = staging_dir(target)
    try:
        yield tmp
        try:
            os.rename(tmp, target)  # POSIX: atomic; replaces an empty directory
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
                raise
            staged = sorted(os.listdir(tmp))
            order = [n for n in staged if n not in last] + [n for n in last if n in staged]
            for name in order:
                os.replace(tmp / name, target / name)
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
