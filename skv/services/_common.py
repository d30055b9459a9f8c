"""What every service shares: env parsing, the bind address, OpenAI-style errors and routes,
a flushed JSONL appender, a server in a thread. Request checks are :mod:`skv.services.checks`,
upstream relaying :mod:`skv.services.relay`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

log = logging.getLogger(__name__)


DEFAULT_HOST = "127.0.0.1"


#: the seed project's names (``SEMANTICKV_<X>``) are read as aliases of ``SKV_<X>``
LEGACY_PREFIX = "SEMANTICKV_"


_warned_legacy: set[str] = set()


def env_raw(name: str) -> str | None:
    """``os.environ[name]``, else its legacy ``SEMANTICKV_`` alias (warned about once per name).

    Every service reads its ``SKV_*`` settings through here, so users of the seed project keep
    working; the ``SKV_`` name wins when both are set.
    """
    raw = os.environ.get(name)
    if raw is not None or not name.startswith("SKV_"):
        return raw
    legacy = LEGACY_PREFIX + name.removeprefix("SKV_")
    raw = os.environ.get(legacy)
    if raw is not None and legacy not in _warned_legacy:
        _warned_legacy.add(legacy)
        log.warning("%s is deprecated; use %s (read as its alias)", legacy, name)
    return raw


def env_bool(name: str, default: bool) -> bool:
    raw = env_raw(name)
    if raw is None or raw.strip() == "":
        return default
    val = raw.strip().lower()
    if val in ("1", "true", "yes", "on"):
        return True
    if val in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected true/false")


def env_float(name: str, default: float) -> float:
    raw = env_raw(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None


def env_str(name: str, default: str | None = None) -> str | None:
    raw = env_raw(name)
    return default if raw is None or raw.strip() == "" else raw.strip()


def env_int(name: str, default: int) -> int:
    raw = env_raw(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


#: concurrent connections a service accepts before answering new requests 503
#: (``SKV_MAX_CONNECTIONS``, ``--max-connections``); well under the usual 1024 open files
DEFAULT_MAX_CONNECTIONS = 512

#: seconds a service keeps an idle keep-alive connection open (uvicorn's own default is 5 s).
#: Longer than the idle expiry of common clients (httpx and so the OpenAI SDK: 5 s; aiohttp:
#: 15 s): a client reuses an idle connection up to its expiry, and a request sent on a
#: connection its server is closing at that moment gets no response at all (2 of 20,000 in
#: benchmarks/service_load.py at uvicorn's 5 s). The header timeout still closes a connection
#: that stays idle longer than the body read timeout (:func:`_guarded_h11`).
DEFAULT_KEEP_ALIVE_S = 20.0

#: seconds a request's whole body may take to arrive after its headers (a local client sends
#: 4 MiB in milliseconds; 30 s is a 4 MiB body at about 1 Mbit/s)
DEFAULT_BODY_READ_TIMEOUT_S = 30.0


def max_connections_from_env() -> int:
    """``SKV_MAX_CONNECTIONS`` or :data:`DEFAULT_MAX_CONNECTIONS`."""
    return env_int("SKV_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS)


def _guarded_h11(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request headers have not arrived
    ``header_timeout_s`` after it opened (or after its previous answer): uvicorn itself waits
    for them forever, so a client that opens connections and sends nothing, or half a header,
    would hold them (the body has its own limit: :class:`skv.services.checks.BodyLimit`)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: Any = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():  # no request yet: nobody to answer
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a request's headers arrived
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # the next request's headers (a pipelined one disarms it at once)
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol


def server_options(
    max_connections: int | None = None, read_timeout_s: float | None = None
) -> dict[str, Any]:
    """uvicorn settings every service runs with: at most ``max_connections`` concurrent
    connections (beyond: 503 and close; default :data:`DEFAULT_MAX_CONNECTIONS`), request
    headers within ``read_timeout_s`` (default: the body read timeout,
    :data:`DEFAULT_BODY_READ_TIMEOUT_S`) and idle keep-alive connections kept
    :data:`DEFAULT_KEEP_ALIVE_S`."""
    cap = DEFAULT_MAX_CONNECTIONS if max_connections is None else max_connections
    wait = DEFAULT_BODY_READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s
    if cap < 1:
        raise ValueError(f"max connections must be >= 1, got {cap}")
    if not wait > 0:
        raise ValueError(f"read timeout must be > 0 seconds, got {wait}")
    return {
        "limit_concurrency": cap,
        "http": _guarded_h11(wait),
        "timeout_keep_alive": DEFAULT_KEEP_ALIVE_S,
    }


@contextmanager
def serve_in_thread(
    app: Any,
    host: str = DEFAULT_HOST,
    *,
    lifespan: str = "off",
    timeout_s: float = 10.0,
    max_connections: int | None = None,
    read_timeout_s: float | None = None,
) -> Iterator[str]:
    """Run an ASGI ``app`` under uvicorn on ``host`` (a free port) in a daemon thread; yield its
    base URL. For experiments and tests that need a real HTTP hop in this process.
    ``lifespan="on"`` runs the app's startup and shutdown (closing what it opened) there.
    The server has the services' connection cap and header timeout (:func:`server_options`)."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    options = server_options(max_connections, read_timeout_s)
    config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, **options)
    server = uvicorn.Server(config)
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started:
            if time.monotonic() > deadline or not th.is_alive():
                raise RuntimeError(f"uvicorn did not start on {host}:{port}")
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        th.join(timeout=5)
        sock.close()


def openai_error(status: int, message: str, kind: str, **extra: Any) -> JSONResponse:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code", ...}}``."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status, **extra}}, status_code=status
    )


def add_completion_routes(
    app: FastAPI, handle: Callable[[Request, str, bool], Awaitable[Response]]
) -> None:
    """The two OpenAI endpoints, both served by ``handle(request, endpoint, chat)``."""

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await handle(request, "/v1/chat/completions", True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, "/v1/completions", False)


class JsonlAppender:
    """Appends one JSON object per line to a file, flushed per record, thread-safe.

    The file is created (with ``header`` as its first line when given) on the first append.
    """

    def __init__(self, path: str | Path, header: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.header = dict(header) if header is not None else None
        self._lock = threading.Lock()
        self._fh: Any = None
        self.count = 0

    def append_line(self, line: str) -> None:
        with self._lock:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
                if self.header is not None and self._fh.tell() == 0:
                    self._fh.write(json.dumps(self.header, sort_keys=True) + "\n")
            self._fh.write(line.rstrip("\n") + "\n")
            self._fh.flush()
            self.count += 1

    def append(self, obj: Mapping[str, Any]) -> None:
        self.append_line(json.dumps(obj, sort_keys=True, default=str))

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def run_stamp() -> str:
    """``YYYYmmdd-HHMMSS-<pid>``: a per-process file stem, so runs never share a file."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
