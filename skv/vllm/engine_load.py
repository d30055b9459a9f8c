"""Drive one vLLM engine stage by stage and get the engine's own timings back.

:class:`EngineLoad` starts :mod:`skv.vllm.loadgen` with the engine venv's interpreter (vLLM's
``AsyncLLM`` in that process, its engine core in a child), sends it stages of open-loop
requests and returns what it measured (:class:`StageResult`: per request the engine core's
timestamps, every token's arrival at the frontend and the cached tokens; per step its batch and
model time). The engine starts once (~30 s) and serves any number of stages, so a search that
picks its next load from the last result costs no restarts.

Cores: the engine core's compute threads get their own CPUs (``VLLM_CPU_OMP_THREADS_BIND``)
and the frontend, which also sends the load, the others (:func:`cpu_split`): on the 2-core
reference machine one each. On a single CPU they share it, and :attr:`EngineLoad.shared_cpu`
says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skv.vllm.server import engine_env, find_engine_python, setup_hint

log = logging.getLogger(__name__)


class EngineLoadError(RuntimeError):
    """The engine process failed, stopped answering, or refused a command; the message ends
    with the tail of its log."""


@dataclass
class StageResult:
    """What one stage measured: request rows and step rows as :mod:`skv.vllm.loadgen` documents
    them, in the order the requests were given."""

    name: str
    requests: list[dict[str, Any]]
    steps: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def errors(self) -> list[str]:
        return [f"{r['id']}: {r['error']}" for r in self.requests if r.get("error")]


def cpu_split(cpus: list[int] | None = None) -> tuple[list[int], list[int]]:
    """(frontend CPUs, engine CPUs): the engine takes the last CPU, the frontend the rest; with
    one CPU both get it."""
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    if len(cpus) < 2:
        return list(cpus), list(cpus)
    return list(cpus[:-1]), [cpus[-1]]


class EngineLoad:
    """One engine in :mod:`skv.vllm.loadgen`; use as a context manager (it stops the engine).

    ``engine_args`` are vLLM ``AsyncEngineArgs`` keywords (model, block_size,
    num_gpu_blocks_override, max_num_seqs, max_num_batched_tokens, max_model_len, dtype...);
    ``env`` adds environment variables (skv's eviction plugin: :func:`eviction_env`).
    """

    def __init__(
        self,
        engine_args: dict[str, Any],
        *,
        python: str | Path | None = None,
        log_path: str | Path | None = None,
        cpus: list[int] | None = None,
        startup_timeout: float = 600.0,
        stage_margin_s: float = 600.0,
        env: dict[str, str] | None = None,
    ) -> None:
        py = python or find_engine_python()
        if py is None:
            raise FileNotFoundError(f"no vLLM engine venv: {setup_hint()}")
        self.python = Path(py)
        self.engine_args = dict(engine_args)
        self.extra_env = dict(env or {})
        self.frontend_cpus, self.engine_cpus = cpu_split(cpus)
        self.shared_cpu = bool(set(self.frontend_cpus) & set(self.engine_cpus))
        self.startup_timeout = startup_timeout
        self.stage_margin_s = stage_margin_s
        self._tmp: tempfile.TemporaryDirectory | None = None
        if log_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="skv-engine-load-")
            log_path = Path(self._tmp.name) / "engine.log"
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()
        self._seq = 0
        self._broken: str | None = None
        self.info: dict[str, Any] = {}

    # ------------------------------------------------------------------ process

    def start(self) -> dict[str, Any]:
        """Start the process and the engine; returns ``{"vllm", "ready_s"}``."""
        from skv.vllm import loadgen

        env = engine_env()
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, self.engine_cpus))
        # vLLM logs every step at INFO once iteration details are on: the frontend would spend
        # its core writing them; warnings and errors still reach the log
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        for k in [k for k in env if k.startswith("SKV_EVICTION")]:
            del env[k]  # stock vLLM unless this engine was asked for a policy
        env.update(self.extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115  (closed in close())
        cmd = [str(self.python), loadgen.__file__, "--cpus", ",".join(map(str, self.frontend_cpus))]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        threading.Thread(target=self._read_replies, daemon=True).start()
        self.info = self._call({"cmd": "start", "engine": self.engine_args}, self.startup_timeout)
        log.info(
            "vLLM %s ready in %.1f s (frontend CPUs %s, engine CPUs %s)",
            self.info.get("vllm"),
            self.info.get("ready_s", 0.0),
            self.frontend_cpus,
            self.engine_cpus,
        )
        return self.info

    def _read_replies(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(line)
        self._replies.put(None)  # the process closed its reply stream

    def _call(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one command and wait for its reply (matched by sequence number), checking once
        a second that the process is alive. After a timeout or a lost process the engine is
        unusable: a late reply would answer the wrong command."""
        if self.proc is None or self.proc.stdin is None or self._broken:
            raise EngineLoadError(f"the engine process is not usable{self._broken or ''}")
        self._seq += 1
        cmd = {**cmd, "seq": self._seq}
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self._broken = f" (process gone: {exc})"
            raise EngineLoadError(f"engine process gone ({exc}){self._tail()}") from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._replies.get(timeout=1.0)
                break
            except queue.Empty:
                if self.proc.poll() is not None:
                    line = None
                    break
                if time.monotonic() > deadline:
                    self._broken = f" (no answer to {cmd['cmd']!r} in {timeout:.0f} s)"
                    msg = f"no answer to {cmd['cmd']!r} in {timeout:.0f} s{self._tail()}"
                    raise EngineLoadError(msg) from None
        if line is None:
            self._broken = " (process exited)"
            raise EngineLoadError(f"engine process exited during {cmd['cmd']!r}{self._tail()}")
        out = json.loads(line)
        if out.get("seq") != self._seq:
            self._broken = " (replies out of step)"
            raise EngineLoadError(f"reply {out.get('seq')} to command {self._seq}{self._tail()}")
        if not out.get("ok"):
            raise EngineLoadError(f"{cmd['cmd']!r} failed: {out.get('error')}{self._tail()}")
        return out

    def _tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- engine log tail ---\n" + "\n".join(text)

    # ------------------------------------------------------------------ stages

    def run_stage(
        self,
        name: str,
        requests: list[dict[str, Any]],
        *,
        reset_cache: bool = True,
        sequential_gap_s: float | None = None,
    ) -> StageResult:
        """Send ``requests`` (``id``, ``prompt_token_ids``, ``max_tokens``, ``arrival_s``) open
        loop, or one at a time ``sequential_gap_s`` apart; wait for every one to finish (at most
        the last arrival, or the gaps, plus ``stage_margin_s``)."""
        if sequential_gap_s is None:
            span = max((float(r["arrival_s"]) for r in requests), default=0.0)
        else:
            span = len(requests) * float(sequential_gap_s)
        cmd: dict[str, Any] = {
            "cmd": "stage",
            "name": name,
            "requests": requests,
            "reset_cache": reset_cache,
        }
        if sequential_gap_s is not None:
            cmd["sequential_gap_s"] = float(sequential_gap_s)
        t = time.perf_counter()
        out = self._call(cmd, span + self.stage_margin_s)
        res = StageResult(name, out["requests"], out["steps"], time.perf_counter() - t)
        log.info("stage %s: %d requests in %.1f s", name, len(res.requests), res.wall_s)
        return res

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(b'{"cmd": "quit"}\n')
                    proc.stdin.flush()
                    proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
            # the whole group: the engine core may outlive the frontend (its leader)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EngineLoad:
        try:
            self.start()
        except BaseException:
            self.close()  # a failed start must not leave the engine running
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def eviction_env(policy: str | None, params: dict[str, Any] | None = None, *, log: Path) -> dict:
    """The environment that makes the engine run skv's eviction plugin with ``policy`` (None:
    stock vLLM), the policy's clock being each request's ``skv_time`` (what
    :class:`skv.vllm.server.VllmServer` sets for ``--eviction``)."""
    if policy is None:
        return {}
    from skv.vllm.server import checkout_root

    return {
        "SKV_EVICTION": policy,
        "SKV_EVICTION_PARAMS": json.dumps(params or {}),
        "SKV_EVICTION_LOG": str(log),
        "SKV_EVICTION_CLOCK": "client",
        "SKV_CHECKOUT": str(checkout_root()),
    }
