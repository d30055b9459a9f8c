"""The repurpose studies' shortcuts give the numbers of the long way, exactly: a replay that
reads only the cache's totals (:func:`.study.replay_stats`), the regime map's cells run once
per distinct run (``cell_key``) and grouped by draw (``task_key``) and workload (``run_key``),
its layouts of one ``zipf_rag`` draw (:class:`zipf_rag.Layouts`), its segment-keyed hit rate
read from the totals where an ``lru`` cache evicts nothing, the tiered sweep's free run
shared by stacks whose tiers differ only in their links, and ``zipf_rag``'s kept document
lengths. Tiny configs: the quick runs do not reach every path (quick regimes hold
``doc_order`` at one value)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from skv.experiments import regimes as R
from skv.experiments.repurpose import regimes as RR
from skv.experiments.repurpose import study as S
from skv.experiments.repurpose import tiered as RT
from skv.replay import compile_trace
from skv.workloads import WORKLOADS, zipf_rag
from skv.workloads.base import (
    Chat,
    Context,
    Message,
    ZipfSampler,
    draw_length,
    poisson_arrivals,
    rng_for,
)
from skv.workloads.zipf_rag import Layouts, ZipfRagParams

REPO = Path(__file__).resolve().parents[1]
REGIMES = REPO / "experiments/repurpose/repurpose_regimes.yaml"


def _rag(**changes):
    return WORKLOADS["zipf_rag"](ZipfRagParams(**{"num_requests": 150, "seed": 3, **changes}))


@pytest.mark.parametrize("mode", ["prefix", "segment"])
@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_replay_stats_are_chain_hits_totals(mode, policy):
    trace = compile_trace(_rag(docs_per_request=3, zipf_alpha=1.2), block_size=16, mode=mode)
    for cap in (600, 2000, 10**6):
        chains, stats = S.chain_hits(trace, policy, cap)
        got = S.replay_stats(trace, policy, cap)
        assert dataclasses.asdict(got) == dataclasses.asdict(stats)
        assert got.hit_tokens == sum(map(sum, chains))


def _doc_tokens(rb, hit: int) -> int:
    """Document tokens among the first ``hit`` tokens of ``rb``'s blocks (the last block
    partly, when ``hit`` ends inside it): the regime cell's count per request until 7d7866d."""
    doc = 0
    left = hit
    for t, st in zip(rb.tokens, rb.stypes, strict=True):
        if left <= 0:
            break
        if st == RR.DOC:
            doc += min(t, left)
        left -= t
    return doc


def _old_replay(k: RR.Keyed, policy: str, capacity: int) -> dict[str, float]:
    """The regime cell's replay as it was at f24c3ea (every keying through chain_hits, each
    one-chain request's document hits counted from its chain's hit tokens)."""
    chains, stats = S.chain_hits(k.trace, policy, capacity)
    doc_hits = 0
    single = True
    for rb, hits in zip(k.trace, chains, strict=True):
        if len(hits) == 1:
            if hits[0] > 0:
                doc_hits += _doc_tokens(rb, hits[0])
        else:
            single = False
    prompt = k.totals.prompt_tokens
    hit = stats.hit_tokens
    return {
        "token_hit_rate": hit / prompt,
        "doc_hit_rate": doc_hits / prompt if single else float("nan"),
        "head_hit_rate": (hit - doc_hits) / prompt if single else float("nan"),
        "head_share": k.head_share,
    }


@pytest.mark.parametrize(
    "changes",
    [{}, {"docs_first": True}, {"doc_order": "sorted"}, {"docs_per_request": 1},
     {"fixed_prefix_fraction": 1.0, "docs_per_request": 1}],
)  # fmt: skip
def test_regime_replay_equals_the_old_replay(changes):
    for mode in RR.MODES:
        trace = compile_trace(_rag(**changes), block_size=16, mode=mode)
        k = RR.keyed(trace)
        assert k.single == (mode == "prefix")
        assert k.single == all(len(st) == 1 for st in S.chain_starts(trace))
        for policy in ("lru", "s3fifo"):
            for cap in (600, 2000, 10**6):
                new, old = RR.replay(k, policy, cap), _old_replay(k, policy, cap)
                assert list(new) == list(old) and repr(new) == repr(old)  # NaN equals NaN


def _old_chats(params: ZipfRagParams, ctx: Context) -> list[Chat]:
    """``zipf_rag.chats`` as it was at 5a4f547: draws and layout in one loop."""
    from skv.workloads.zipf_rag import NAME, _history, _system, document

    p = params
    tg = ctx.textgen
    rng = rng_for(p.seed, NAME, "content")
    arrivals = poisson_arrivals(rng_for(p.seed, NAME, "arrivals"), p.num_requests, p.rate_rps)
    zipf = ZipfSampler(p.corpus_size, p.zipf_alpha)
    fixed = Message("system", (tg.text(f"{NAME}/fixed_prefix", 0, p.fixed_prefix_tokens),))
    systems = [Message("system", (_system(tg, k, p),)) for k in range(p.num_system_prompts)]
    histories: dict = {}
    docs: dict = {}
    out = []
    for i, t in enumerate(arrivals):
        if rng.random() < p.fixed_prefix_fraction:
            head, variant = [fixed], "fixed"
        else:
            s = int(rng.integers(0, p.num_system_prompts))
            h = int(rng.integers(0, p.num_histories))
            hist = histories.get(h)
            if hist is None:
                u, a = _history(tg, h, p)
                hist = histories[h] = (Message("user", (u,)), Message("assistant", (a,)))
            head, variant = [systems[s], *hist], f"{s}/{h}"
        doc_ids = zipf.sample_distinct(rng, p.docs_per_request)
        if p.doc_order == "sorted":
            doc_ids = sorted(doc_ids)
        sections = []
        for d in doc_ids:
            text = docs.get(d)
            if text is None:
                text = docs[d] = document(tg, d, p)
            sections.append(text)
        question = tg.fresh(rng, draw_length(rng, p.question_tokens, p.length_sigma))
        asked = tg.join("Question:", question)
        if p.docs_first and variant != "fixed":
            messages = [Message("user", tuple(sections)), *head, Message("user", (asked,))]
        else:
            messages = [*head, Message("user", (*sections, asked))]
        out.append(
            Chat(
                request_id=f"{ctx.id_prefix}{NAME}-{i:06d}",
                arrival_s=ctx.time_offset_s + t,
                messages=messages,
                output_tokens=draw_length(rng, p.output_tokens, p.length_sigma),
                extra={"doc_ids": doc_ids, "prefix": variant},
            )
        )
    return out


@pytest.mark.parametrize("k", [1, 3])
def test_layouts_of_one_draw_are_the_fresh_workloads(k):
    """``zipf_rag``'s chats, drawn then laid out, are those of the one loop it had; and every
    layout of one draw (:class:`zipf_rag.Layouts`, the regime map's workloads) gives the
    requests ``WORKLOADS["zipf_rag"]`` makes for it, in any order of asking."""
    base = ZipfRagParams(num_requests=150, seed=3, docs_per_request=k, fixed_prefix_fraction=0.3)
    layouts = Layouts(base)
    for order in ("sorted", "retrieval"):
        for docs_first in (True, False):
            p = ZipfRagParams(**{**base.model_dump(), "doc_order": order, "docs_first": docs_first})
            old = _old_chats(p, Context.for_params(p))
            new = zipf_rag.chats(p, Context.for_params(p))
            assert new == old and repr(new) == repr(old)
            got, want = layouts.requests(p), WORKLOADS["zipf_rag"](p)
            assert want == Context.for_params(p).renderer.render(old)
            assert got == want
            assert [r.extra for r in got] == [r.extra for r in want]
            assert repr(got) == repr(want)
            again = RR.workload_requests(p.model_dump_json())
            assert again == want and [r.extra for r in again] == [r.extra for r in want]
    with pytest.raises(ValueError, match="other than the layout"):
        layouts.requests(ZipfRagParams(**{**base.model_dump(), "seed": 4}))


@pytest.mark.parametrize("changes", [{}, {"docs_first": True}, {"docs_per_request": 1}])
def test_an_lru_cache_with_room_for_every_block_hits_the_ceiling(changes):
    """Segment keying's hit rate read from the trace's totals (:func:`.regimes.no_eviction`)
    is the replay's, and the shortcut is taken exactly where it holds."""
    trace = compile_trace(_rag(**changes), block_size=16, mode="segment")
    k = RR.keyed(trace)
    unique = k.totals.unique_blocks
    for policy in ("lru", "s3fifo"):
        for cap in (60, 600, unique - 1, unique, unique + 1, 10**6):
            assert RR.no_eviction(k, policy, cap) == (policy == "lru" and cap >= unique)
            stats = S.replay_stats(trace, policy, cap)
            want = stats.hit_tokens / k.totals.prompt_tokens
            assert RR.replay(k, policy, cap)["token_hit_rate"] == want
            if RR.no_eviction(k, policy, cap):
                assert stats.evictions == 0


def test_one_document_in_either_order_is_the_same_workload():
    """``zipf_rag`` sorts a list of one and draws nothing for it: every request, block and
    key is the same, so the cell keys of the two orders are equal (for k > 1 they are not)."""
    a, b = _rag(docs_per_request=1), _rag(docs_per_request=1, doc_order="sorted")
    for mode in RR.MODES:
        ta = compile_trace(a, block_size=16, mode=mode)
        tb = compile_trace(b, block_size=16, mode=mode)
        for x, y in zip(ta, tb, strict=True):
            assert (x.keys, x.parents, x.tokens, x.stypes, x.arrival_s) == (
                y.keys, y.parents, y.tokens, y.stypes, y.arrival_s
            )  # fmt: skip
    assert [r.extra for r in a] == [r.extra for r in b]
    cfg = RR.load(REGIMES, quick=False)
    s = {"capacity": "30GB", "fixed_prefix_fraction": 0.2, "docs_first": False}
    k1, k4 = ({**s, "docs_per_request": k} for k in (1, 4))
    key = cfg.cell_key
    assert key({**k1, "doc_order": "sorted"}) == key({**k1, "doc_order": "retrieval"})
    assert key({**k4, "doc_order": "sorted"}) != key({**k4, "doc_order": "retrieval"})
    # the key holds every input of the cell: a changed capacity, policy, model, block size or
    # workload parameter is another run
    base = key({**k4, "doc_order": "retrieval"})
    for other in (
        {"capacity": "1TB"},
        {"config.policy": "s3fifo"},
        {"config.model": "qwen2.5-7b"},
        {"config.block_size": 32},
        {"num_histories": 1024},
    ):
        assert key({**k4, "doc_order": "retrieval", **other}) != base


def _tiny_map() -> RR.RepurposeRegimeConfig:
    """The full map's axes with both orders and k = 1, tiny workloads, and its toggles."""
    cfg = RR.load(REGIMES, quick=False)
    data = cfg.model_dump(mode="json")
    data.update(
        workload={"num_requests": 120, "corpus_size": 300},
        seeds=[0, 1],
        axes={
            "capacity": ["1GB", "30GB"],
            "fixed_prefix_fraction": [0.2],
            "docs_per_request": [1, 2],
            "docs_first": [False, True],
            "doc_order": ["retrieval", "sorted"],
        },
        paper_setup={},
    )
    at = {"capacity": "1GB", "fixed_prefix_fraction": 0.2, "docs_per_request": 2}
    data["toggles"]["at"] = {**at, "docs_first": False, "doc_order": "retrieval"}
    return RR.RepurposeRegimeConfig.model_validate(data)


class Plain(RR.RepurposeRegimeConfig):
    """The map with the default hooks: every setting its own run, tasks by shared axes."""

    cell_key = R.RegimeConfig.cell_key
    task_key = R.RegimeConfig.task_key


CALLS: list[dict] = []


def counting_cell(cfg, setting, seed):
    CALLS.append(setting)
    return RR.cell(cfg, setting, seed)


def _fresh_cell(cfg, setting, seed):
    """A cell as before: built anew, replayed the old way."""
    run, axes = RR.effective(cfg, setting)
    requests = WORKLOADS["zipf_rag"](RR.workload_params(run, axes, seed))
    out = {}
    for mode in RR.MODES:
        k = RR.keyed(compile_trace(requests, block_size=run.block_size, mode=mode))
        cap = S.capacity_blocks(
            str(axes.get("capacity", "30GB")), block_size=run.block_size, model=run.model,
            total_blocks=k.totals.block_accesses,
        )  # fmt: skip
        out[mode] = _old_replay(k, run.policy, cap)
    return out


def _same(row: pd.Series, want: dict[str, float]) -> bool:
    return repr({m: float(row[m]) for m in want}) == repr(want)  # repr: NaN equals NaN


def _clear_caches() -> None:
    for f in (RR.workload_layouts, RR.workload_requests, RR.keyed_traces):
        f.cache_clear()


def test_the_map_runs_each_distinct_cell_once_with_the_old_numbers():
    cfg = _tiny_map()
    CALLS.clear()
    _clear_caches()
    rows = R.run_grid(cfg, counting_cell, jobs=1)
    if not CALLS:
        pytest.skip("cells ran on an SKV_DASK cluster")
    # 16 settings x 2 seeds, of which k = 1 sorted (4 settings) repeats k = 1 retrieval
    assert len(CALLS) == (16 - 4) * 2
    assert not any(c["docs_per_request"] == 1 and c["doc_order"] == "sorted" for c in CALLS)
    # one draw per k and seed: its layouts and capacities are one task
    assert RR.workload_layouts.cache_info().misses == 2 * 2
    # one build per workload and seed: a workload's capacities run back to back
    assert RR.workload_requests.cache_info().misses == (8 - 2) * 2
    assert RR.keyed_traces.cache_info().misses == (8 - 2) * 2
    by_label = {tuple(R.axis_label(v) for v in s.values()): s for s in cfg.settings()}
    for _, row in rows.iterrows():
        setting = by_label[tuple(row[a] for a in cfg.axes)]
        assert _same(row, _fresh_cell(cfg, setting, int(row["seed"]))[row["policy"]])
    # the same rows as a run that merges and groups nothing by workload
    plain = Plain.model_validate(cfg.model_dump())
    pd.testing.assert_frame_equal(R.run_grid(plain, RR.cell, jobs=1), rows)


def test_toggles_of_one_workload_share_a_task_and_keep_their_numbers():
    cfg = _tiny_map()
    CALLS.clear()
    _clear_caches()
    rows = R.run_toggles(cfg, counting_cell, jobs=1)
    if not CALLS:
        pytest.skip("cells ran on an SKV_DASK cluster")
    named = cfg.toggle_settings()
    seeds = sorted(set(rows["seed"]))  # the ledger's seeds (its own, where it has them)
    n = len(seeds)
    assert len(CALLS) == len(named) * n
    # at, policy_s3fifo and model_qwen2.5_7b replay one workload: compiled once per seed
    assert RR.keyed_traces.cache_info().misses == (len(named) - 2) * n
    # ... and block_size_32 the same requests, built once per seed with theirs
    assert RR.workload_requests.cache_info().misses == (len(named) - 3) * n
    assert RR.workload_layouts.cache_info().misses == (len(named) - 3) * n
    for name, setting in named:
        for seed in seeds:
            want = _fresh_cell(cfg, setting, seed)
            d = rows[(rows["toggle"] == name) & (rows["seed"] == seed)]
            assert len(d) == 2
            for _, row in d.iterrows():
                assert _same(row, want[row["policy"]])
    plain = Plain.model_validate(cfg.model_dump())
    pd.testing.assert_frame_equal(R.run_toggles(plain, RR.cell, jobs=1), rows)


def test_tiered_stacks_sharing_a_free_run_give_the_rows_of_each_stack_alone(monkeypatch):
    """dram and ssd differ only in their link, as do both and both_rdma: one free run serves
    each pair, and every row equals the one a sweep of that stack alone gives."""
    data = RT.load("experiments/repurpose/repurpose_tiered.yaml", quick=True).model_dump()
    data.update(
        workload={"num_requests": 300, "corpus_size": 300},
        seeds=[0],
        gpu="2GB",
        stacks={
            "gpu_only": [],
            "dram": ["cpu=4GB"],
            "ssd": ["disk=4GB"],
            "both": ["cpu=2GB", "disk=4GB"],
            "both_rdma": ["cpu=2GB", "disk=4GB,link=rdma"],
        },
        claim_stack="dram",
    )
    cfg = RT.TieredConfig.model_validate(data)
    replays = []
    real = RT._replay

    def counting(trace, starts, cache):
        replays.append(1)
        return real(trace, starts, cache)

    monkeypatch.setattr(RT, "_replay", counting)
    for mode in ("prefix", "segment"):
        replays.clear()
        got = RT.sweep_part(cfg, 0, mode)
        assert len(replays) == 2 + 4  # two free runs, one paid run per tiered stack
        alone = [
            RT.sweep_part(cfg.model_copy(update={"stacks": {name: stack}}), 0, mode)
            for name, stack in cfg.stacks.items()
        ]
        pd.testing.assert_frame_equal(got, pd.concat(alone, ignore_index=True))
        assert got["loaded_segments"].max() > 0 and got["lower_hit_rate"].max() > 0


def test_document_lengths_kept_per_seed_equal_fresh_ones():
    from skv.workloads import zipf_rag as Z

    Z._DOC_TOKENS.clear()
    for seed, n in ((0, 50), (0, 400), (0, 120), (1, 120), (0, 400)):
        p = ZipfRagParams(num_requests=10, seed=seed, corpus_size=n)
        got = Z.document_tokens(p)
        want = Z._document_tokens(seed, p.doc_tokens, p.length_sigma, n)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        got[:] = -1  # a caller's change does not reach the kept array
    assert len(Z._DOC_TOKENS[(0, 512, 0.5)]) == 400
    p = ZipfRagParams(num_requests=10, seed=0, corpus_size=50, doc_tokens=300)
    assert np.array_equal(Z.document_tokens(p), Z._document_tokens(0, 300, 0.5, 50))
