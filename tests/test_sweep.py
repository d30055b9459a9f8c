"""The sweep executor on a Dask cluster (``SKV_DASK`` / ``--dask``): the same bytes as local
processes, clear errors, no process left behind. CI has no cluster: a LocalCluster stands in
for one (it is the same ``distributed.Client`` path as a ``tcp://`` scheduler)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import time
from pathlib import Path

import dask
import psutil
import pytest
import yaml

from skv.cli import main
from skv.experiments import runner
from skv.experiments.report import write_aggregate
from skv.experiments.sweep import DaskAddressError, dask_target, run_sweep

SMOKE = Path(__file__).resolve().parents[1] / "experiments" / "semantickv" / "smoke.yaml"


def draws_task(seed: int) -> dict:
    """Floats whose every bit depends on the seed only (module level: workers import it).
    The first task is slow, so that on two workers the tasks finish out of order."""
    if seed == 0:
        time.sleep(0.5)
    rng = random.Random(seed)
    xs = [rng.random() for _ in range(50)]
    return {"seed": seed, "draws": xs, "mean": sum(xs) / len(xs), "tag": f"s{seed}"}


def failing_task(seed: int) -> int:
    if seed == 99:
        raise ValueError(f"no good seed {seed}")
    return seed


def children() -> set[int]:
    """This process's children, less multiprocessing's resource tracker (one per process,
    started by the first process pool and kept until exit by design)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "multiprocessing.resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
    return out


def no_new_children(before: set[int], timeout_s: float = 15.0) -> set[int]:
    """Child processes started since ``before`` still alive after ``timeout_s`` (none is the
    goal: the LocalCluster is closed by the sweep, its workers with it)."""
    deadline = time.monotonic() + timeout_s
    while (left := children() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_sweep_gives_byte_identical_results_on_a_local_cluster(monkeypatch):
    monkeypatch.delenv("SKV_DASK", raising=False)
    tasks = list(range(7))
    before = children()
    here = run_sweep(draws_task, tasks, jobs=1)
    processes = run_sweep(draws_task, tasks, jobs=2)
    seen: list[int] = []
    cluster = run_sweep(
        draws_task, tasks, jobs=2, dask="local", on_result=lambda i, _: seen.append(i)
    )
    monkeypatch.setenv("SKV_DASK", "local")  # the environment variable takes the same path
    from_env = run_sweep(draws_task, tasks, jobs=2)
    assert [r["seed"] for r in here] == tasks  # task order, whatever finished first
    # JSON writes each float's shortest exact repr: equal text is equal bits (pickle is not
    # canonical: its memo depends on which objects happen to be shared)
    blobs = {json.dumps(r) for r in (here, processes, cluster, from_env)}
    assert len(blobs) == 1 and here == processes == cluster == from_env
    assert sorted(seen) == tasks and seen[0] != 0  # finished out of order, returned in order
    assert no_new_children(before) == set()


def test_a_failing_task_is_named_in_every_mode(monkeypatch):
    monkeypatch.delenv("SKV_DASK", raising=False)
    before = children()
    for mode in ({"jobs": 1}, {"jobs": 2}, {"jobs": 2, "dask": "local"}):
        with pytest.raises(ValueError, match="no good seed 99") as info:
            run_sweep(failing_task, [1, 99, 2], label="seeds", **mode)
        assert info.value.__notes__ == ["seeds: task 2 of 3 failed: 99"], mode
    assert no_new_children(before) == set()


def test_bad_skv_dask_values_fail_before_anything_runs(monkeypatch):
    assert dask_target("") is None and dask_target(" local ") == "local"
    assert dask_target("tcp://10.0.0.5:8786") == "tcp://10.0.0.5:8786"
    assert dask_target("tcp://[::1]:8786") == "tcp://[::1]:8786"
    for bad in ("bogus", "tcp://host", "http://host:8786", "tcp://host:port", "Local"):
        monkeypatch.setenv("SKV_DASK", bad)
        with pytest.raises(ValueError, match=r"SKV_DASK / --dask must be 'local'"):
            run_sweep(draws_task, [1, 2], jobs=1)
    monkeypatch.delenv("SKV_DASK")
    unreachable = pytest.raises(DaskAddressError, match=r"no Dask scheduler answers at tcp://")
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), unreachable:
        run_sweep(draws_task, [1, 2], dask="tcp://127.0.0.1:1")


def tiny_configs(root: Path) -> Path:
    configs = root / "configs"
    configs.mkdir()
    for name, policies in (("tiny_a", ["lru", "belady"]), ("tiny_b", ["fifo", "lru"])):
        data = yaml.safe_load(SMOKE.read_text())
        data.update(id=name, policies=policies, seeds=[0, 1], in_suite=True)
        data["workload"]["params"]["num_requests"] = 60
        (configs / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return configs


def outputs(root: Path) -> dict[str, bytes]:
    """Every output under ``root`` by experiment id (run directory names carry the time),
    run.log (timings) aside."""
    out = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        exp = re.sub(r"^\d{8}_\d{6}_", "", d.name)
        for f in sorted(d.iterdir()):
            if f.name != "run.log":
                out[f"{exp}/{f.name}"] = f.read_bytes()
    for f in sorted(root.glob("aggregate_summary.*")):
        out[f.name] = re.sub(rb"\d{8}_\d{6}_", b"<time>_", f.read_bytes())
    return out


def test_run_all_through_the_executor_equals_one_process(tmp_path, monkeypatch, capsys):
    configs = tiny_configs(tmp_path)
    paths = sorted(configs.glob("*.yaml"))
    # the old run-all: each config through run_experiment in this process, then the aggregate
    old = tmp_path / "old"
    dirs = [runner.run_experiment(p, old) for p in paths]
    docs = [json.loads((d / "results.json").read_text()) for d in dirs]
    write_aggregate(docs, dirs, old)
    reference = outputs(old)
    assert len(reference) == 2 * 10 + 2  # every output of both, and the aggregate

    monkeypatch.delenv("SKV_DASK", raising=False)
    monkeypatch.setenv("SKV_JOBS", "2")
    before = children()
    out = tmp_path / "dask"
    argv = ["run-all", "--config-dir", str(configs), "--output-root", str(out), "--dask", "local"]
    assert main(argv) == 0
    assert outputs(out) == reference
    assert no_new_children(before) == set()
    one = tmp_path / "one"
    assert runner.run_all(None, one, config_dir=configs, jobs=1)[0][0].parent == one
    assert outputs(one) == reference
    capsys.readouterr()

    for bad, says in (("bogus", "must be 'local'"), ("tcp://127.0.0.1:1", "no Dask scheduler")):
        with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
            argv = ["run-all", "--config-dir", str(configs), "--output-root", str(tmp_path / "x")]
            assert main([*argv, "--dask", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("skv: error: ") and says in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # nothing ran


def test_a_failing_config_is_named_on_the_command_line(tmp_path, capsys):
    data = yaml.safe_load(SMOKE.read_text())
    data.update(id="tiny_share", capacities=["0.0001%"], seeds=[0])  # 0 blocks at run time
    path = tmp_path / "tiny_share.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run-all", str(path), "--output-root", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"skv: error: {path}: experiment tiny_share: capacities[0]")
    assert err[1:] == [f"  run-all: task 1 of 1 failed: {path}"]


def test_the_pipeline_hands_skv_dask_to_its_notebooks(monkeypatch, capsys):
    from skv.artifact import pipeline

    seen: list[str | None] = []

    def fake_run(*a, **k):
        seen.append(os.environ.get("SKV_DASK"))  # what execute_notebook's children inherit
        return []

    monkeypatch.setattr(pipeline, "run_pipeline", fake_run)
    monkeypatch.setenv("SKV_DASK", "")  # empty is unset; restored after the test
    assert pipeline.main(["run", "--dask", "tcp://nowhere", "fig_x"]) == 2
    assert "must be 'local'" in capsys.readouterr().err and seen == []
    assert pipeline.main(["run", "--dask", "local", "fig_x"]) == 0
    monkeypatch.setenv("SKV_DASK", "bogus")
    assert pipeline.main(["run", "fig_x"]) == 2 and "'bogus'" in capsys.readouterr().err
    assert seen == ["local"]
