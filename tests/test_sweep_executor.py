"""Studies run their independent runs through the sweep executor (skv.experiments.sweep): the
same results whatever the number of processes."""

from __future__ import annotations

import json
from pathlib import Path

from skv.experiments.saecache import study as SAE

SMOKE = Path("experiments/semantickv/smoke.yaml")


def _configs(tmp_path: Path) -> Path:
    d = tmp_path / "configs"
    d.mkdir()
    text = SMOKE.read_text()
    for name, n in (("a", 60), ("b", 80)):
        (d / f"{name}.yaml").write_text(
            text.replace("id: smoke", f"id: smoke_{name}").replace(
                "num_requests: 100", f"num_requests: {n}"
            )
        )
    return d


def _results(runs: dict[str, Path]) -> dict[str, dict]:
    out = {}
    for ident, run_dir in runs.items():
        doc = json.loads((run_dir / "results.json").read_text())
        out[ident] = {"runs": doc["runs"], "comparisons": doc.get("comparisons")}
    return out


def test_saecache_configs_give_the_same_results_in_one_or_two_processes(tmp_path):
    configs = _configs(tmp_path)
    one = SAE.run_configs(configs, tmp_path / "one", quick=False, jobs=1)
    two = SAE.run_configs(configs, tmp_path / "two", quick=False, jobs=2)
    assert sorted(one) == sorted(two) == ["smoke_a", "smoke_b"]
    assert _results(one) == _results(two)
    assert {r["requests"] for r in _results(one)["smoke_a"]["runs"]} == {60}
