"""Writing result and trace files safely: all or nothing."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
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
