"""The last unclear errors of issue 33: each names file, line and field (or is accepted), and a
run killed outright leaves nothing that looks like a run.

- a native trace whose segment ``content_hash`` is not hex: refused at load, naming it;
- a trace that starts with a UTF-8 byte order mark (Mooncake, native, Azure CSV): read;
- a long ``seeds`` list: refused with the real bound (100 seeds), not a word about anchors;
- a SIGKILL while a run is being written: no (empty) run directory; the staging directory it
  leaves is removed by the next run into the same root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from skv.experiments import runner
from skv.experiments.config import ConfigError, config_from_dict, load_config
from skv.fileio import clean_stale_partials, stale_partials
from skv.traces import TraceFormatError, detect_format, load_trace

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SMOKE = ROOT / "experiments" / "semantickv" / "smoke.yaml"
BOM = b"\xef\xbb\xbf"


# ------------------------------------------------------------------------------ traces


def _native(path: Path, content_hash: str) -> Path:
    header = {"skv_trace": 1, "num_requests": 2}
    seg = {"stype": "system", "num_tokens": 8}
    good = {"request_id": "a", "arrival_s": 0.0,
            "segments": [{**seg, "content_hash": "0123abcdEF"}]}  # fmt: skip
    bad = {"request_id": "b", "arrival_s": 1.0,
           "segments": [seg, {**seg, "content_hash": content_hash}]}  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in (header, good, bad)) + "\n")
    return path


@pytest.mark.parametrize("value", ["xyz-not-hex", "0x1f", "1_2", " ab", "", "-1f"])
def test_a_non_hex_content_hash_names_file_line_and_field(tmp_path, value):
    path = _native(tmp_path / "t.jsonl", value)
    with pytest.raises(TraceFormatError) as err:
        load_trace(path)
    msg = str(err.value)
    assert "t.jsonl" in msg and ":3" in msg and "segments.1.content_hash" in msg, msg
    assert "hex" in msg and "invalid literal" not in msg


def test_a_hex_content_hash_still_loads_and_keys_blocks(tmp_path):
    from skv.blocks import request_blocks

    a, b = load_trace(_native(tmp_path / "t.jsonl", "ABCDEF0123"))
    assert (a.segments[0].content_hash, b.segments[1].content_hash) == ("0123abcdEF", "ABCDEF0123")
    assert request_blocks(a, 4).num_blocks == 2


def test_a_mooncake_trace_with_a_byte_order_mark_is_read(tmp_path):
    plain = DATA / "mooncake_tiny.jsonl"
    bom = tmp_path / plain.name  # ids and hashes derive from the file's stem
    bom.write_bytes(BOM + plain.read_bytes())
    assert detect_format(bom) == "mooncake"
    assert load_trace(bom) == load_trace(plain)


def test_native_and_azure_traces_with_a_byte_order_mark_are_read(tmp_path):
    native = _native(tmp_path / "n.jsonl", "ff")
    (tmp_path / "bom").mkdir()
    bom = tmp_path / "bom" / "n.jsonl"
    bom.write_bytes(BOM + native.read_bytes())
    assert detect_format(bom) == "skv" and load_trace(bom) == load_trace(native)
    azure = tmp_path / "bom" / "azure_tiny.csv"
    azure.write_bytes(BOM + (DATA / "azure_tiny.csv").read_bytes())
    assert detect_format(azure) == "azure2023"
    assert load_trace(azure) == load_trace(DATA / "azure_tiny.csv")


# ------------------------------------------------------------------------------ configs


def _smoke() -> dict:
    return yaml.safe_load(SMOKE.read_text())


@pytest.mark.parametrize("n", [101, 20_000])
def test_a_long_seeds_list_names_the_real_limit(tmp_path, n):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**_smoke(), "seeds": list(range(n))}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert f"c.yaml: seeds: {n} entries" in msg and "at most 100 seeds" in msg, msg
    assert "anchor" not in msg and "alias" not in msg


def test_an_alias_bomb_still_names_anchors_and_a_plain_big_list_does_not(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="YAML anchors and aliases multiply"):
        load_config(bomb)
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({**_smoke(), "notes": list(range(20_000))}))
    with pytest.raises(ConfigError) as err:
        load_config(big)
    msg = str(err.value)
    assert "notes" in msg and "20000 entries" in msg and "at most 10000 values" in msg, msg
    assert "anchor" not in msg


# ------------------------------------------------------------------------------ run directories

_KILLED_WRITER = """
import datetime as dt, os, signal, sys
from pathlib import Path
from skv.experiments import runner
from skv.experiments.config import config_from_dict
import yaml

config = config_from_dict({**yaml.safe_load(Path(sys.argv[1]).read_text()), "seeds": [0]})

def write(tmp):
    (tmp / "metrics.csv").write_text("half of a run")
    os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit: as kill -9 mid-write

runner._publish(Path(sys.argv[2]), config, dt.datetime.now(), write)
"""


def test_a_run_killed_while_writing_leaves_no_run_and_the_next_run_cleans_up(
    tmp_path, monkeypatch, caplog
):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED_WRITER), str(SMOKE), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(out.iterdir())
    assert [p for p in left if not p.name.startswith(".")] == []  # no (empty) run directory
    assert len(left) == 1 and left[0].name.endswith(".partial")
    assert stale_partials(out) == ([left[0]], [])  # its writer is gone: removable

    config = config_from_dict({**_smoke(), "seeds": [0]}, source="smoke")
    doc = {"marker": 1}
    monkeypatch.setattr(runner, "simulate_experiment", lambda *a, **k: doc)
    monkeypatch.setattr(runner, "_write_files", lambda d, tmp, log: _fake_files(d, tmp))
    with caplog.at_level("WARNING", logger="skv.fileio"):
        run_dir = runner.run_experiment(config, out)
    assert sorted(p.name for p in out.iterdir()) == [run_dir.name]  # the leftover is gone
    assert json.loads((run_dir / "results.json").read_text()) == doc
    assert "interrupted run" in caplog.text and left[0].name in caplog.text


def _fake_files(doc: dict, tmp: Path) -> None:
    (tmp / "metrics.csv").write_text("x")
    (tmp / "results.json").write_text(json.dumps(doc))


def test_stale_partials_of_live_or_unknown_writers_are_kept_and_named(tmp_path, caplog):
    live = tmp_path / f".run.{_host()}-{os.getppid()}-0123abcd.partial"  # pytest's parent: alive
    old = tmp_path / ".run.89abcdef.partial"  # an older skv's: no writer recorded
    other = tmp_path / ".run.otherhost-1-0123abcd.partial"
    for p in (live, old, other):
        p.mkdir()
    (tmp_path / "results").mkdir()  # not a staging directory
    with caplog.at_level("WARNING", logger="skv.fileio"):
        assert clean_stale_partials(tmp_path) == []
    assert all(p.exists() for p in (live, old, other))
    assert old.name in caplog.text and other.name in caplog.text and live.name not in caplog.text


def test_runs_finishing_at_the_same_second_get_distinct_directories(tmp_path):
    import datetime as dt

    now = dt.datetime(2026, 1, 2, 3, 4, 5)
    made = []
    for _ in range(3):
        staged = tmp_path / f".s{len(made)}.partial"
        staged.mkdir()
        (staged / "results.json").write_text("{}")
        made.append(runner.publish_run_dir(staged, tmp_path, "x", now))
    assert [p.name for p in made] == ["20260102_030405_x", "20260102_030405_x_2",
                                      "20260102_030405_x_3"]  # fmt: skip
    empty = tmp_path / "20260102_030406_x"  # an empty directory of the name is no run
    empty.mkdir()
    staged = tmp_path / ".s.partial"
    staged.mkdir()
    (staged / "results.json").write_text("{}")
    assert runner.publish_run_dir(staged, tmp_path, "x", now.replace(second=6)) == empty
    assert (empty / "results.json").exists()


def _host() -> str:
    from skv.fileio import _host

    return _host()
