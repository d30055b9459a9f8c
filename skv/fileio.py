"""Writing result and trace files safely: all or nothing.

:func:`atomic_write` for one file, :func:`atomic_dir` for a directory of files (a run's
results, plots and log): an interrupted or failed write never leaves a file or a directory that
looks complete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike[str]


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


def _staging_dir(target: Path) -> Path:
    """A new, empty hidden directory beside ``target`` (mode from the umask, as ``mkdir``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
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
    tmp = _staging_dir(target)
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
