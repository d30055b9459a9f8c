"""The paper-artifact pipeline: every figure and table is one notebook, run by papermill.

``python -m skv.artifact.pipeline run [--quick] [--force] [-j N] [STEP ...]`` executes the notebooks
of :data:`STEPS` (all, or the named ones plus what they depend on) with their pinned config from
``experiments/``; ``check`` compares the numbers they wrote with ``experiments/claims.yaml``;
``list`` prints the registry. ``./reproduce.sh`` calls these.

Where things go (:class:`Layout`): the full run writes figures to ``figures/``, tables to
``paper/tables/``, executed notebooks, step outputs and ``run.log`` under ``build/``;
``--quick`` writes everything under ``build/quick/`` (never over full results).

A step is skipped as *cached* when its key (a hash of its notebook, its config, the skv version
and source, its parameters and the keys of the steps it depends on) matches the last successful
run and its outputs exist; ``--force`` runs it anyway. A step whose real trace is missing is
*skipped* with the reason, never run into an empty figure. Independent steps run in parallel,
except steps whose numbers include a real engine's time (``measures_time``): in the full run
they run alone, so no other step shares the CPU with their timings. The other engine steps
(cache hits replayed one request at a time, a model's answers) give the same numbers on a busy
CPU: they share it with other steps, but never with a second vLLM server (``starts_server``;
the quality probe starts none). ``--quick`` checks no timing claim, so there every
engine step is scheduled that way (its times are from a shared CPU, and its figures say the
run was quick). Free slots go to the steps whose last recorded run was longest (the steps that
run alone wait until nothing else can start, so they run last). A run that fails names its
failed steps last, with their errors and logs.

Steps and the sweep executor (:mod:`skv.experiments.sweep`): the steps themselves stay here,
papermill subprocesses on a thread pool, and never go to a Dask cluster: they read and write
this checkout (figures, tables, ``build/``), depend on each other's output directories, are
cached by key on this machine, and the timed engine steps need the machine to themselves. What is
heavy inside a step is its sweeps (capacities x policies x seeds x rates), and those go
through the executor in the notebook's process, which inherits this environment: so
``SKV_DASK`` (or ``run --dask ADDR|local``, which sets it for the notebooks after checking
it) sends every notebook's sweeps to the same cluster. With ``local`` each sweep makes its
own LocalCluster, as it would outside the pipeline; to share one pool of workers between
notebooks running in parallel, start a scheduler and pass its address. Sweeps give the same
results in every mode, so ``SKV_DASK`` is not part of a step's cache key.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from skv.artifact import claims as claims_mod
from skv.artifact import timings
from skv.artifact.claims import ClaimsFile

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
KERNEL = "python3"


@dataclass(frozen=True)
class Step:
    """One notebook of the paper: its config, the files it must produce (``figures/<f>`` or
    ``tables/<f>``), the real traces it reads (names under the trace directory) and the steps
    whose output directories it reads (passed as ``<dep>_dir`` parameters)."""

    name: str
    #: the study it belongs to: ``notebooks/<study>/``, ``skv/experiments/<study>/`` and
    #: (mostly) ``experiments/<study>/`` share the name
    study: str
    config: str
    outputs: tuple[str, ...]
    needs_traces: tuple[str, ...] = ()
    #: real traces it reads when present and does without otherwise (a column left empty):
    #: their presence is part of the step's cache key, so adding one reruns the step
    optional_traces: tuple[str, ...] = ()
    #: runs in the vLLM engine venv (skv.vllm): skipped, with the reason, when it is absent
    needs_engine: bool = False
    #: starts vLLM servers (with ``needs_engine``): never beside another step that does, whose
    #: requests would stall its own; False for work in the engine venv without a server
    starts_server: bool = True
    #: its figure or claims include measured engine time (TTFT, throughput, an SLO): it runs
    #: alone, nothing else shares the CPU with it
    measures_time: bool = False
    depends: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    #: other config files or folders the step reads (a study's ``base``): part of its cache key
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.measures_time and not (self.needs_engine and self.starts_server):
            raise ValueError(f"step {self.name}: measures_time is for steps that start a server")

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.study}/{self.name}.ipynb"


def _fig(name: str) -> tuple[str, str]:
    return (f"figures/{name}.pdf", f"figures/{name}.png")


SUITE = "tab_aggregate_summary"

STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(
            SUITE,
            "semantickv",
            "experiments/semantickv",
            ("tables/aggregate_summary.csv", "tables/aggregate_summary.tex"),
        ),
        Step(
            "fig_policy_comparison",
            "semantickv",
            "experiments/semantickv",
            _fig("fig_policy_comparison"),
            depends=(SUITE,),
        ),
        Step(
            "fig_evictions_by_type",
            "semantickv",
            "experiments/semantickv/low_memory_rag_stress.yaml",
            _fig("fig_evictions_by_type"),
            depends=(SUITE,),
        ),
        Step(
            "fig_adaptive_weights",
            "semantickv",
            "experiments/semantickv/workload_shift_static_vs_adaptive.yaml",
            _fig("fig_adaptive_weights"),
            depends=(SUITE,),
        ),
        Step(
            "fig_memory_utilisation",
            "semantickv",
            "experiments/semantickv/low_memory_rag_stress.yaml",
            _fig("fig_memory_utilisation"),
            depends=(SUITE,),
        ),
        Step(
            "fig_hit_rate_mooncake",
            "replay",
            "experiments/replay/mooncake_capacity.yaml",
            _fig("fig_hit_rate_mooncake"),
            needs_traces=("mooncake/conversation_trace.jsonl",),
        ),
        Step(
            "fig_hit_rate_claude_code",
            "replay",
            "experiments/replay/claude_code_capacity.yaml",
            _fig("fig_hit_rate_claude_code"),
            needs_traces=("weka_cc",),
        ),
        Step(
            "fig_claude_code_session_gap",
            "replay",
            "experiments/replay/claude_code_session_gap.yaml",
            _fig("fig_claude_code_session_gap"),
            needs_traces=("weka_cc",),
        ),
        Step(
            "fig_claude_code_tiered",
            "replay",
            "experiments/replay/claude_code_tiered.yaml",
            (
                *_fig("fig_claude_code_tiered"),
                "tables/claude_code_tiered.csv",
                "tables/claude_code_tiered.tex",
            ),
            needs_traces=("weka_cc",),
        ),
        Step(
            "tab_reuse_by_type_claude_code",
            "replay",
            "experiments/replay/claude_code_capacity.yaml",
            ("tables/reuse_by_type_claude_code.csv", "tables/reuse_by_type_claude_code.tex"),
            needs_traces=("weka_cc",),
        ),
        Step(
            "fig_sampling_accuracy",
            "replay",
            "experiments/replay/sampling_accuracy.yaml",
            (
                *_fig("fig_sampling_accuracy"),
                "tables/sampling_accuracy.csv",
                "tables/sampling_accuracy.tex",
            ),
            needs_traces=("weka_cc", "mooncake/conversation_trace.jsonl"),
        ),
        Step(
            "fig_policy_leaderboard",
            "leaderboard",
            "experiments/leaderboard/policy_leaderboard.yaml",
            (
                *_fig("fig_policy_leaderboard"),
                "tables/policy_leaderboard.csv",
                "tables/policy_leaderboard.tex",
            ),
            optional_traces=("weka_cc", "mooncake/conversation_trace.jsonl"),
        ),
        Step(
            "fig_saecache_regimes",
            "saecache",
            "experiments/saecache/saecache_regimes.yaml",
            (
                *_fig("fig_saecache_regimes"),
                "tables/saecache_regimes.csv",
                "tables/saecache_regimes.tex",
                "tables/saecache_toggles.csv",
                "tables/saecache_toggles.tex",
            ),
            inputs=("experiments/saecache/grid",),
        ),
        Step(
            "fig_saecache_tuning",
            "saecache",
            "experiments/saecache/saecache_tuning.yaml",
            (
                *_fig("fig_saecache_tuning"),
                "tables/saecache_tuning.csv",
                "tables/saecache_tuning.tex",
            ),
            inputs=("experiments/saecache/grid",),
            depends=("tab_saecache_grid",),
        ),
        Step(
            "tab_saecache_grid",
            "saecache",
            "experiments/saecache/grid",
            ("tables/saecache_grid.csv", "tables/saecache_grid.tex"),
        ),
        Step(
            "fig_saecache_ttft",
            "saecache",
            "experiments/saecache/grid",
            _fig("fig_saecache_ttft"),
            depends=("tab_saecache_grid",),
        ),
        Step(
            "fig_saecache_hit",
            "saecache",
            "experiments/saecache/grid",
            _fig("fig_saecache_hit"),
            depends=("tab_saecache_grid",),
        ),
        Step(
            "fig_saecache_ablation",
            "saecache",
            "experiments/saecache/ablation",
            _fig("fig_saecache_ablation"),
        ),
        Step(
            "tab_saecache_reuse_by_type",
            "saecache",
            "experiments/saecache/grid",
            ("tables/saecache_reuse_by_type.csv", "tables/saecache_reuse_by_type.tex"),
            optional_traces=("weka_cc",),
        ),
        Step(
            "fig_saecache_learned_params",
            "saecache",
            "experiments/saecache/learned_params.yaml",
            _fig("fig_saecache_learned_params"),
        ),
        Step(
            "fig_fidelity_vllm",
            "fidelity",
            "experiments/fidelity/fidelity_vllm.yaml",
            _fig("fig_fidelity_vllm"),
            needs_engine=True,
            measures_time=True,
        ),
        Step(
            "fig_fidelity_load",
            "fidelity",
            "experiments/fidelity/fidelity_load.yaml",
            (
                *_fig("fig_fidelity_load"),
                "tables/fidelity_load_errors.csv",
                "tables/fidelity_load_errors.tex",
            ),
            needs_engine=True,
            measures_time=True,
        ),
        Step(
            "fig_fidelity_eviction",
            "fidelity",
            "experiments/fidelity/eviction_verdict.yaml",
            (
                *_fig("fig_fidelity_eviction"),
                "tables/fidelity_eviction.csv",
                "tables/fidelity_eviction.tex",
            ),
            needs_engine=True,
            measures_time=True,
        ),
        Step(
            "fig_routing_vllm",
            "routing",
            "experiments/routing/routing_vllm.yaml",
            (*_fig("fig_routing_vllm"), "tables/routing_vllm.csv", "tables/routing_vllm.tex"),
            needs_engine=True,
            measures_time=True,
        ),
        Step(
            "fig_vllm_eviction",
            "vllm_eviction",
            "experiments/vllm_eviction/vllm_eviction.yaml",
            (*_fig("fig_vllm_eviction"), "tables/vllm_eviction.csv", "tables/vllm_eviction.tex"),
            needs_engine=True,
            measures_time=True,  # its right panel: TTFT per variant
        ),
        Step(
            "fig_repurpose_hit_rate",
            "repurpose",
            "experiments/repurpose/repurpose_capacity.yaml",
            (
                *_fig("fig_repurpose_hit_rate"),
                "tables/repurpose_summary.csv",
                "tables/repurpose_summary.tex",
            ),
        ),
        Step(
            "fig_repurpose_ttft",
            "repurpose",
            "experiments/repurpose/repurpose_capacity.yaml",
            _fig("fig_repurpose_ttft"),
            depends=("fig_repurpose_hit_rate",),
        ),
        Step(
            "fig_repurpose_sensitivity",
            "repurpose",
            "experiments/repurpose/repurpose_sensitivity.yaml",
            (
                *_fig("fig_repurpose_sensitivity"),
                "tables/repurpose_sensitivity.csv",
                "tables/repurpose_sensitivity.tex",
            ),
        ),
        Step(
            "fig_repurpose_regimes",
            "repurpose",
            "experiments/repurpose/repurpose_regimes.yaml",
            (
                *_fig("fig_repurpose_regimes"),
                "tables/repurpose_regimes.csv",
                "tables/repurpose_regimes.tex",
                "tables/repurpose_toggles.csv",
                "tables/repurpose_toggles.tex",
            ),
        ),
        Step(
            "fig_repurpose_tiered",
            "repurpose",
            "experiments/repurpose/repurpose_tiered.yaml",
            (
                *_fig("fig_repurpose_tiered"),
                "tables/repurpose_tiered.csv",
                "tables/repurpose_tiered.tex",
            ),
        ),
        Step(
            "fig_repurpose_vllm",
            "repurpose",
            "experiments/repurpose/repurpose_vllm.yaml",
            (*_fig("fig_repurpose_vllm"), "tables/repurpose_vllm.csv", "tables/repurpose_vllm.tex"),
            needs_engine=True,
        ),
        Step(
            "fig_repurpose_quality",
            "repurpose",
            "experiments/repurpose/repurpose_quality.yaml",
            (
                *_fig("fig_repurpose_quality"),
                "tables/repurpose_quality.csv",
                "tables/repurpose_quality.tex",
            ),
            needs_engine=True,
            starts_server=False,  # transformers in the engine venv, no vLLM server
        ),
        Step(
            "fig_cacheroute_qps",
            "cacheroute",
            "experiments/cacheroute/qps_aggregate.yaml",
            (*_fig("fig_cacheroute_qps"), "tables/cacheroute_qps.csv", "tables/cacheroute_qps.tex"),
        ),
        Step(
            "fig_cacheroute_load",
            "cacheroute",
            "experiments/cacheroute/load_aggregate.yaml",
            _fig("fig_cacheroute_load"),
        ),
        Step(
            "fig_cacheroute_counterexample",
            "cacheroute",
            "experiments/cacheroute/counterexample.yaml",
            (
                *_fig("fig_cacheroute_counterexample"),
                "tables/cacheroute_counterexample.csv",
                "tables/cacheroute_counterexample.tex",
            ),
        ),
        Step(
            "fig_cacheroute_mooncake",
            "cacheroute",
            "experiments/cacheroute/qps_mooncake.yaml",
            (
                *_fig("fig_cacheroute_mooncake"),
                "tables/cacheroute_mooncake.csv",
                "tables/cacheroute_mooncake.tex",
            ),
            needs_traces=("mooncake/conversation_trace.jsonl",),
        ),
        Step(
            "fig_cacheroute_regimes",
            "cacheroute",
            "experiments/cacheroute/cacheroute_regimes.yaml",
            (
                *_fig("fig_cacheroute_regimes"),
                "tables/cacheroute_regimes.csv",
                "tables/cacheroute_regimes.tex",
                "tables/cacheroute_toggles.csv",
                "tables/cacheroute_toggles.tex",
            ),
            inputs=("experiments/cacheroute/qps_aggregate.yaml",),
        ),
        Step(
            "fig_cacheroute_tuning",
            "cacheroute",
            "experiments/cacheroute/cacheroute_tuning.yaml",
            (
                *_fig("fig_cacheroute_tuning"),
                "tables/cacheroute_tuning.csv",
                "tables/cacheroute_tuning.tex",
            ),
            inputs=("experiments/cacheroute/qps_aggregate.yaml",),
        ),
    )
}


@dataclass(frozen=True)
class Layout:
    """Where a run writes: figures, tables, executed notebooks, step outputs, cache, log."""

    figures: Path
    tables: Path
    build: Path

    @classmethod
    def for_run(cls, root: Path = REPO, *, quick: bool = False) -> Layout:
        if quick:
            b = root / "build" / "quick"
            return cls(b / "figures", b / "tables", b)
        return cls(root / "figures", root / "paper" / "tables", root / "build")

    @property
    def notebooks(self) -> Path:
        return self.build / "notebooks"

    def step_dir(self, name: str) -> Path:
        return self.build / "steps" / name

    def step_log(self, name: str) -> Path:
        """What papermill printed while running step ``name``."""
        return self.step_dir(name) / "papermill.log"

    @property
    def cache(self) -> Path:
        return self.build / ".cache"

    @property
    def log(self) -> Path:
        return self.build / "run.log"

    def output(self, rel: str) -> Path:
        kind, _, name = rel.partition("/")
        return {"figures": self.figures, "tables": self.tables}[kind] / name

    def paper(self, root: Path = REPO) -> Path:
        """Where the paper of this run is built: ``paper/`` (full) or ``build/quick/paper/``."""
        return root / "paper" if self.tables == root / "paper" / "tables" else self.build / "paper"


# ----------------------------------------------------------------------------------------
# cache keys


def _hash_path(h: Any, path: Path) -> None:
    if path.is_dir():
        for p in sorted(path.glob("*.yaml")):
            _hash_path(h, p)
    elif path.is_file():
        h.update(str(path.name).encode())
        h.update(path.read_bytes())
    else:
        h.update(b"<missing>")


def source_hash() -> str:
    """Hash of the package version and every skv source file (not the compiled builds)."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    try:
        h.update(version("skv").encode())
    except PackageNotFoundError:
        h.update(b"?")
    pkg = REPO / "skv"
    for p in sorted(pkg.rglob("*")):
        if p.suffix in {".py", ".pyx", ".pxd"} and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(pkg)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def step_key(
    step: Step, params: dict[str, Any], dep_keys: Sequence[str], src: str, root: Path = REPO
) -> str:
    h = hashlib.sha256()
    h.update(step.name.encode())
    _hash_path(h, root / step.notebook)
    _hash_path(h, root / step.config)
    for extra in step.inputs:
        _hash_path(h, root / extra)
    h.update(src.encode())
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    for k in dep_keys:
        h.update(k.encode())
    for t in (*step.needs_traces, *step.optional_traces):  # a new or replaced trace reruns it
        p = _trace_path(t)
        if p is not None:
            st = p.stat()
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]


def _trace_path(name: str) -> Path | None:
    from skv.traces import find_trace

    try:
        return find_trace(name)
    except FileNotFoundError:
        return None


def missing_traces(step: Step) -> str | None:
    """Why the step cannot run (the first missing trace), or None."""
    return first_missing_trace(step.needs_traces)


def first_missing_trace(names: Sequence[str]) -> str | None:
    """Why the first of ``names`` that is not found is missing, or None when all are found."""
    from skv.traces import find_trace

    for name in names:
        try:
            find_trace(name)
        except FileNotFoundError as exc:
            return str(exc)
    return None


def missing_engine(step: Step) -> str | None:
    """Why a ``needs_engine`` step cannot run (no vLLM engine venv), or None."""
    if not step.needs_engine:
        return None
    from skv.vllm.server import find_engine_python, setup_hint

    if find_engine_python() is None:
        return f"vLLM engine venv absent: {setup_hint()}"
    return None


# ----------------------------------------------------------------------------------------
# running


@dataclass
class Result:
    step: str
    status: str  # ran | cached | skipped | failed
    seconds: float = 0.0
    note: str = ""
    #: CPU seconds of the step's process tree (papermill, its kernel, and every process the
    #: kernel waited for: sweep workers, engines), from wait4; None when it did not run
    cpu_seconds: float | None = None


def select(names: Sequence[str] | None) -> list[Step]:
    """The named steps plus everything they depend on, in registry order (all when empty)."""
    if not names:
        return list(STEPS.values())
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise SystemExit(f"unknown step(s) {unknown}; known: {', '.join(STEPS)}")
    want: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n not in want:
            want.add(n)
            todo.extend(STEPS[n].depends)
    return [s for s in STEPS.values() if s.name in want]


def notebook_params(step: Step, layout: Layout, *, quick: bool, seed: int, root: Path) -> dict:
    params: dict[str, Any] = {
        "quick": quick,
        "config": str(root / step.config),
        "output_dir": str(layout.step_dir(step.name)),
        "seed": seed,
        "figures_dir": str(layout.figures),
        "tables_dir": str(layout.tables),
        **step.params,
    }
    for dep in step.depends:
        params[f"{dep}_dir"] = str(layout.step_dir(dep))
    return params


def figure_stamp(step: Step, *, quick: bool) -> str | None:
    """What a quick run's figures say in their corner (:func:`skv.experiments.plotstyle.save_figure`
    draws it), so a quick figure is never mistaken for the paper's; None in the full run."""
    if not quick:
        return None
    shared = "; engine times from a CPU shared with other steps" if step.measures_time else ""
    return f"--quick run: smaller configs, not the paper's numbers{shared}"


#: run before papermill in its process: jsonschema (through nbformat) imports the optional
#: rfc3987-syntax, which builds a Lark grammar for IRI formats at import, about 1 CPU second
#: (1.0 of papermill's 1.6 s of imports, measured on the AMD VM) in every step; no notebook
#: schema checks an IRI, and jsonschema does without it when it cannot be imported
PAPERMILL_PRELUDE = "import sys; sys.modules['rfc3987_syntax'] = None"
PAPERMILL_MAIN = "from papermill.cli import papermill; papermill(prog_name='papermill')"


def execute_notebook(step: Step, params: dict[str, Any], layout: Layout, root: Path) -> float:
    """papermill, in a child process of this Python (so the venv's ``python3`` kernel); returns
    the CPU seconds (user + system) of that process and every descendant it or they reaped:
    where a step's time goes when steps share the CPU, which its wall time cannot say."""
    layout.notebooks.mkdir(parents=True, exist_ok=True)
    out_dir = layout.step_dir(step.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-c",
        f"{PAPERMILL_PRELUDE}; {PAPERMILL_MAIN}",
        str(root / step.notebook),
        str(layout.notebooks / f"{step.name}.ipynb"),
        "-k",
        KERNEL,
        "--cwd",
        str(root),
        "--no-progress-bar",
        "-y",
        yaml.safe_dump(params),
    ]
    from skv.experiments.plotstyle import FIGURE_STAMP_ENV  # matplotlib: only when a step runs

    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    env.pop(FIGURE_STAMP_ENV, None)
    stamp = figure_stamp(step, quick=bool(params.get("quick")))
    if stamp:
        env[FIGURE_STAMP_ENV] = stamp
    with open(layout.step_log(step.name), "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        # wait4, not wait(): the child's own rusage (RUSAGE_CHILDREN would mix the steps that
        # other threads run at the same time)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = layout.step_log(step.name).read_text(encoding="utf-8").strip().splitlines()[-6:]
        raise RuntimeError(f"papermill exited {proc.returncode}: " + " | ".join(tail))
    return usage.ru_utime + usage.ru_stime


def recorded_seconds(root: Path, mode: str) -> dict[str, float]:
    """Each step's last recorded time in ``mode`` (``experiments/timings.json``), for the order
    in which free slots are given: a hint, so an absent or unreadable record (a merge conflict,
    a hand edit) gives no times and the registry order, with a warning, never a failed run."""
    path = root / "experiments" / "timings.json"
    try:
        steps = timings.load(path)["steps"].get(mode, {})
        return {name: float(entry["seconds"]) for name, entry in steps.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("%s: not used to order the steps (%s)", path, exc)
        return {}


def run_pipeline(
    names: Sequence[str] | None = None,
    *,
    quick: bool = False,
    force: bool = False,
    jobs: int | None = None,
    seed: int = 0,
    layout: Layout | None = None,
    root: Path = REPO,
    echo: bool = True,
) -> list[Result]:
    """Run the selected steps (dependencies first, independent ones in parallel)."""
    layout = layout or Layout.for_run(root, quick=quick)
    steps = select(names)
    jobs = max(1, jobs or os.cpu_count() or 1)
    src = source_hash()
    # the commit the steps run from; a step that ends after the tree moved is "+dirty"
    revision = timings.revision(root)
    layout.build.mkdir(parents=True, exist_ok=True)
    layout.cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, Result] = {}
    keys: dict[str, str] = {}
    lock = threading.Lock()
    t_start = time.perf_counter()
    log_lines = [
        f"# {time.strftime('%Y-%m-%d %H:%M:%S')} run{' --quick' if quick else ''}"
        f"{' --force' if force else ''} -j {jobs}: {', '.join(s.name for s in steps)}"
    ]

    def say(msg: str) -> None:
        with lock:
            log_lines.append(msg)
            if echo:
                print(msg, flush=True)

    def run_one(step: Step) -> Result:
        bad_dep = [
            d for d in step.depends if d in results and results[d].status in ("failed", "skipped")
        ]
        if bad_dep:
            return Result(step.name, "skipped", note=f"needs {bad_dep[0]}, which did not run")
        why = skip_reason(step.name, quick=quick)
        if why:
            return Result(step.name, "skipped", note=why)
        params = notebook_params(step, layout, quick=quick, seed=seed, root=root)
        key = step_key(step, params, [keys.get(d, "") for d in step.depends], src, root)
        keys[step.name] = key
        stamp = layout.cache / f"{step.name}.json"
        outs = [layout.output(o) for o in step.outputs]
        if not force and stamp.is_file() and all(p.is_file() for p in outs):
            prev = json.loads(stamp.read_text(encoding="utf-8"))
            if prev.get("key") == key:
                return Result(step.name, "cached", note="config and code unchanged")
        stamp.unlink(missing_ok=True)
        # a failed rerun must not leave the previous run's numbers to pass as this run's
        (layout.step_dir(step.name) / claims_mod.CLAIMS_FILE).unlink(missing_ok=True)
        say(f"[start] {step.name}")
        t0 = time.perf_counter()
        try:
            cpu = execute_notebook(step, params, layout, root)
        except RuntimeError as exc:
            return Result(step.name, "failed", time.perf_counter() - t0, str(exc))
        elapsed = time.perf_counter() - t0
        missing = [str(p) for p in outs if not p.is_file() or p.stat().st_size == 0]
        if missing:
            note = f"outputs missing or empty: {missing}"
            return Result(step.name, "failed", elapsed, note, cpu)
        # when, and from which commit: the claims' measurement record reads it
        # (skv.artifact.measurements)
        rev = revision if timings.revision(root) == revision else f"{revision}+dirty"
        done = {"key": key, "seconds": round(elapsed, 2), "finished": timings.now(),
                "revision": rev, "mode": "quick" if quick else "full"}  # fmt: skip
        if cpu is not None:
            done["cpu_seconds"] = round(cpu, 2)
        stamp.write_text(json.dumps(done) + "\n")
        return Result(step.name, "ran", elapsed, cpu_seconds=cpu)

    def alone(step: Step) -> bool:
        # --quick checks no timing claim (tests/test_claims.py holds every claim of a timed
        # step that quick checks to a unit that is not a time): there its engine steps only
        # keep to one engine at a time, and their figures' times come from a shared CPU
        return step.measures_time and not quick

    def serves(step: Step) -> bool:
        return step.needs_engine and step.starts_server

    # the longest first (their last recorded times in this mode), so that no long step
    # starts last and runs on alone; the order changes when steps end, never what they compute
    recorded = recorded_seconds(root, "quick" if quick else "full")
    pending = sorted(steps, key=lambda s: -recorded.get(s.name, 0.0))
    running: dict[Future, Step] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            for step in list(pending):
                if len(running) >= jobs or any(alone(r) for r in running.values()):
                    break
                if alone(step) and running:
                    continue  # it measures time: it starts only when nothing else runs
                if serves(step) and any(serves(r) for r in running.values()):
                    continue  # one engine at a time: two would stall each other's requests
                if all(d in results for d in step.depends if d in {s.name for s in steps}):
                    pending.remove(step)
                    running[pool.submit(run_one, step)] = step
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                step = running.pop(fut)
                res = fut.result()
                results[step.name] = res
                n = len(results)
                say(
                    f"[{n}/{len(steps)}] {step.name}: {res.status.upper()} ({res.seconds:.1f} s"
                    f"{'' if res.cpu_seconds is None else f', CPU {res.cpu_seconds:.1f} s'})"
                    f"{': ' + res.note if res.note else ''}"
                )
    ordered = [results[s.name] for s in steps]
    total = time.perf_counter() - t_start
    table = summary_table(ordered, total, root / "build" / "install.json")
    say(table)
    with open(layout.log, "a", encoding="utf-8") as f:
        f.write("\n".join(log_lines) + "\n")
    # the measured times the docs quote (skv.artifact.timings record/render)
    timings.write_json(
        layout.build / "timings.json",
        timings.run_record(ordered, total, quick=quick, jobs=jobs, all_steps=list(STEPS)),
    )
    try:
        write_paper_values(layout, quick=quick, root=root)
    except (OSError, ValueError) as exc:  # the figures are written; say why the values are not
        say(f"[paper values] not written: {exc}")
    return ordered


def summary_table(results: Sequence[Result], total_s: float, install: Path | None = None) -> str:
    """The run's timing table (Markdown, so ARTIFACT.md can quote build/run.log as it is),
    with the last ``.venv`` install (``build/install.json``, written by reproduce.sh) first."""
    lines = ["| step | status | seconds | note |", "|---|---|---:|---|"]
    if install is not None and install.is_file():
        try:
            inst = json.loads(install.read_text(encoding="utf-8"))
            lines.append(
                f"| (install .venv) | done {inst.get('finished', '?')} | "
                f"{float(inst['seconds']):.1f} | {inst.get('note', '')} |"
            )
        except (ValueError, KeyError, TypeError):
            pass
    for r in results:
        note = r.note if len(r.note) < 160 else r.note[:157] + "..."
        lines.append(f"| {r.step} | {r.status} | {r.seconds:.1f} | {note.replace('|', '/')} |")
    lines.append(f"| total (notebooks) | | {total_s:.1f} | |")
    return "\n".join(lines)


def failure_report(failed: Sequence[Result], layout: Layout) -> str:
    """The failed steps, last thing a run prints (so the tail of a CI log names them, and a
    failure whose claims the quick run does not check is not silent): each step's error and
    its notebook's log. Empty when none failed."""
    if not failed:
        return ""
    lines = [f"\n{len(failed)} step(s) FAILED:"]
    for r in failed:
        lines += [f"  {r.step}: {r.note}", f"    log: {layout.step_log(r.step)}"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------
# claims (the rules live in skv.artifact.claims; this wires them to the steps)

CLAIMS_YAML = REPO / "experiments" / "claims.yaml"


def load_claims(path: Path = CLAIMS_YAML) -> ClaimsFile:
    """``experiments/claims.yaml``, validated against the step registry."""
    return claims_mod.load_claims(path, STEPS)


def skip_reason(name: str, *, quick: bool = False) -> str | None:
    """Why step ``name`` (or a step it needs) cannot run here, and the command that enables
    it; None when it can run."""
    todo, seen = [name], set()
    while todo:
        s = STEPS[todo.pop()]
        if s.name in seen:
            continue
        seen.add(s.name)
        why = missing_traces(s) or missing_engine(s)
        if why:
            rerun = f"./reproduce.sh{' --quick' if quick else ''} {name}"
            needs = "" if s.name == name else f"needs {s.name}: "
            return f"{needs}{why}; then {rerun}"
        todo.extend(s.depends)
    return None


def claim_rows(doc: ClaimsFile, layout: Layout, *, quick: bool) -> list[claims_mod.Row]:
    """Every claim's status against what the steps of ``layout`` wrote."""

    def trace_reason(traces: tuple[str, ...]) -> str | None:
        why = first_missing_trace(traces)
        return why and f"{why} (an optional trace of its step, which ran without it)"

    return claims_mod.check_all(
        doc,
        layout.step_dir,
        quick=quick,
        skip_reason=lambda s: skip_reason(s, quick=quick),
        trace_reason=trace_reason,
    )


def check_claims(
    *,
    quick: bool = False,
    layout: Layout | None = None,
    claims_path: Path | None = None,
    echo: bool = True,
) -> list[claims_mod.Row]:
    """Compare each claim with the value its step wrote (statuses in skv.artifact.claims)."""
    layout = layout or Layout.for_run(quick=quick)
    rows = claim_rows(load_claims(claims_path or CLAIMS_YAML), layout, quick=quick)
    if echo:
        print(claims_mod.format_rows(rows))
        print(claims_mod.summary_line(rows))
    return rows


# ----------------------------------------------------------------------------------------
# the paper (numbers from the runs; skv.artifact.paper)


def write_paper_values(
    layout: Layout, *, quick: bool, root: Path = REPO, claims_path: Path | None = None
) -> list[Path]:
    """``<paper>/generated/values.tex`` and ``layout.tex`` from what the steps produced; a step
    whose outputs are missing is named with why and the command that makes it."""
    from skv.artifact import paper

    doc = load_claims(claims_path or CLAIMS_YAML)
    produced = paper.collect_produced(STEPS, layout.step_dir)
    skipped = {}
    for s in STEPS.values():
        if all(layout.output(o).is_file() for o in s.outputs):
            continue
        why = skip_reason(s.name, quick=quick)
        skipped[s.name] = why or f"run ./reproduce.sh{' --quick' if quick else ''} {s.name}"
    rows = claim_rows(doc, layout, quick=quick)
    return paper.write_generated(
        layout.paper(root),
        doc,
        produced,
        quick=quick,
        figures_dir=layout.figures,
        tables_dir=layout.tables,
        skipped=skipped,
        statuses={r.claim.id: r.status for r in rows},
    )


def build_paper(*, quick: bool = False, root: Path = REPO, layout: Layout | None = None) -> int:
    """Write the generated values, compile the PDF, and check that every figure a step
    produced went into it (a skipped step's figure is a framed placeholder instead)."""
    import shutil

    from skv.artifact import paper

    layout = layout or Layout.for_run(root, quick=quick)
    pdir = layout.paper(root)
    if pdir != root / "paper":
        pdir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / "paper" / "main.tex", pdir / "main.tex")
    written = write_paper_values(layout, quick=quick, root=root)
    ran = [s for s in STEPS if (layout.step_dir(s) / claims_mod.CLAIMS_FILE).is_file()]
    claim_steps = {c.id: c.step for c in load_claims().claims}
    undefined = paper.undefined_values(
        (pdir / "main.tex").read_text(encoding="utf-8"),
        written[0].read_text(encoding="utf-8"),
        ran,
        claim_steps,
    )
    if undefined:
        print(
            f"[paper] main.tex prints values this run did not produce: {', '.join(undefined)}",
            file=sys.stderr,
        )
        return 1
    try:
        pdf = paper.build_pdf(pdir)
    except RuntimeError as exc:
        print(f"[paper] {exc}", file=sys.stderr)
        return 1
    included = paper.figures_in_pdf(pdir)
    figures = [o for s in STEPS.values() for o in s.outputs if o.startswith("figures/")]
    pdfs = {Path(o).stem: layout.output(o).is_file() for o in figures if o.endswith(".pdf")}
    made = {name for name, exists in pdfs.items() if exists}
    absent = sorted(made - included)
    placeholders = sorted(name for name, exists in pdfs.items() if not exists)
    print(f"[paper] {pdf}: {len(made & included)} generated figures included")
    if placeholders:
        print(f"[paper] placeholders (not generated in this run): {', '.join(placeholders)}")
    if absent:
        print(f"[paper] generated but not in the PDF: {', '.join(absent)}", file=sys.stderr)
        return 1
    return 0


def measured_main(action: str, build: Path) -> int:
    """``measured record|check``: the claims' measurement record (skv.artifact.measurements)."""
    from skv.artifact import measurements

    doc = load_claims()
    if action == "record":
        changed, refused = measurements.record(doc, build)
        for line in changed or ["nothing new"]:
            print(f"[measured] {line}")
        for line in refused:
            print(f"[measured] refused {line}", file=sys.stderr)
    rows = measurements.check(doc, measurements.load())
    print(claims_mod.format_rows(rows))
    print(claims_mod.summary_line(rows))
    return 1 if claims_mod.failing(rows) else 0


# ----------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m skv.artifact.pipeline", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks (all, or the named steps)")
    r.add_argument("steps", nargs="*", help=f"steps (default: all): {', '.join(STEPS)}")
    r.add_argument("--quick", action="store_true", help="reduced sizes, into build/quick/")
    r.add_argument("--force", action="store_true", help="rerun steps even when cached")
    r.add_argument("-j", "--jobs", type=int, default=None, help="parallel steps (default: cores)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--dask",
        metavar="ADDR|local",
        default=None,
        help="run the notebooks' sweeps on a Dask cluster (tcp://HOST:PORT, or 'local': a "
        "LocalCluster per sweep): sets SKV_DASK for them; results and cache keys unchanged",
    )
    c = sub.add_parser("check", help="compare produced numbers with experiments/claims.yaml")
    c.add_argument("--quick", action="store_true", help="check the quick run's values")
    c.add_argument(
        "--markdown", action="store_true", help="print the claims as a Markdown table, no check"
    )
    sub.add_parser("list", help="print the step registry")
    tm = sub.add_parser("timings", help="the docs' measured times (skv.artifact.timings)")
    tm.add_argument("action", choices=["record", "render", "check"],
                    help="record: merge BUILD's measurements into experiments/timings.json and "
                    "render; render: rewrite the docs' timings tables; check: stale tables or "
                    "hand-typed times (exit 1)")  # fmt: skip
    tm.add_argument("build", nargs="?", type=Path, default=REPO / "build")
    ms = sub.add_parser("measured", help="which run each full-run claim's value comes from "
                        "(skv.artifact.measurements)")  # fmt: skip
    ms.add_argument("action", choices=["record", "check"],
                    help="record: fold BUILD's full-run steps into "
                    "experiments/measurements.json; check: each claim against its recorded "
                    "values (exit 1 on a failure)")  # fmt: skip
    ms.add_argument("build", nargs="?", type=Path, default=REPO / "build")
    pp = sub.add_parser("paper", help="write paper values and build the PDF (needs LaTeX)")
    pp.add_argument("--quick", action="store_true", help="from the quick run, into build/quick")
    pp.add_argument(
        "--values-only", action="store_true", help="write generated/*.tex, do not compile"
    )
    args = ap.parse_args(argv)
    if args.cmd in ("run", "check", "paper"):
        try:  # a malformed claims.yaml is a clear error before any step runs, not a traceback
            load_claims()
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.cmd == "paper":
        if args.values_only:
            for f in write_paper_values(Layout.for_run(quick=args.quick), quick=args.quick):
                print(f)
            return 0
        return build_paper(quick=args.quick)
    if args.cmd == "measured":
        return measured_main(args.action, args.build)
    if args.cmd == "timings":
        steps = list(STEPS)
        engine = {s.name for s in STEPS.values() if s.measures_time}  # the ones run alone
        if args.action == "check":
            problems = timings.check(steps, engine=engine)
            print("\n".join(problems) or "timings: the docs' times are all generated and current")
            return 1 if problems else 0
        if args.action == "record":
            for line in timings.record(args.build) or ["nothing new"]:
                print(f"[timings] {line}")
        for f in timings.render(steps, engine=engine):
            print(f"[timings] rendered {f.relative_to(REPO)}")
        return 0
    if args.cmd == "list":
        for s in STEPS.values():
            extra = f"  traces: {', '.join(s.needs_traces)}" if s.needs_traces else ""
            extra += "  needs: vLLM engine" if s.needs_engine else ""
            print(f"{s.name:<32} {s.config:<48}{extra}")
        return 0
    if args.cmd == "check":
        if args.markdown:
            from skv.artifact import measurements

            print(
                claims_mod.markdown_table(load_claims(), measurements.labels(measurements.load()))
            )
            return 0
        rows = check_claims(quick=args.quick)
        return 1 if claims_mod.failing(rows) else 0
    from skv.experiments.sweep import DASK_ENV, check_dask

    try:  # a bad SKV_DASK / --dask fails here once, not in every notebook
        target = check_dask(args.dask)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if target is not None:
        os.environ[DASK_ENV] = target  # the notebooks inherit it (module docstring)
    res = run_pipeline(
        args.steps, quick=args.quick, force=args.force, jobs=args.jobs, seed=args.seed
    )
    failed = [x for x in res if x.status == "failed"]
    bad_claims = False
    if not args.steps:
        # a full run ends with the claims check: claims of skipped steps are reported as
        # skipped (with how to enable them) and do not fail the run
        print("\nclaims:")
        bad_claims = bool(claims_mod.failing(check_claims(quick=args.quick)))
    print(failure_report(failed, Layout.for_run(REPO, quick=args.quick)), end="")
    return 1 if failed or bad_claims else 0


if __name__ == "__main__":
    sys.exit(main())
