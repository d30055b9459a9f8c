"""KV-Repurpose's regime map: where segment keying's lead over prefix caching is the paper's.

The grid (``experiments/repurpose/repurpose_regimes.yaml``) varies the ``zipf_rag`` workload's
structure around the capacity study's setting: the cache (``capacity``), the share of requests
on the one fixed prefix, whether the system prompt and history before the documents recur
(``num_histories``: 32 variants, or so many that each is new), the documents per request,
where the varying part sits (``docs_first``) and the documents' order (``doc_order``). Each
(setting, seed) is one workload (its layouts, ``docs_first`` and ``doc_order``, are laid out
from one draw: :class:`skv.workloads.zipf_rag.Layouts`), compiled once per keying and replayed
once through the same ``lru`` cache (the capacity study's replay,
:func:`skv.experiments.repurpose.study.chain_hits`, through its totals:
:func:`~skv.experiments.repurpose.study.replay_stats`; a segment-keyed cache with room for
every unique block evicts nothing, and its hits are read from the trace's totals:
:func:`replay`), so the two keyings are paired within a seed. Settings that make the
same cell (equal :meth:`RepurposeRegimeConfig.cell_key`) run once.

What explains prefix caching's level. Under prefix keying a request hits one leading run of
its prompt, so its hit tokens split exactly into those of blocks before the first document
(the fixed prefix, the system prompt, the history: ``head``) and those of document blocks
(``docs``); a cell records both, with the share of the prompt that is head. The capacity
study's 20.9% at 30 GB against the paper's 3.3% is then a statement about which of the two
recurs, measured rather than argued.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError, model_validator

from skv.experiments import regimes as R
from skv.experiments.repurpose import study as S
from skv.model import TYPE_INDEX, SemanticType

MODES = ("prefix", "segment")
#: what a cell records per keying (``head_*``/``doc_*``: the hit rate's two parts)
METRICS = ("token_hit_rate", "head_hit_rate", "doc_hit_rate", "head_share")
#: the block type codes (a compiled trace's ints) of documents and of the question
DOC = TYPE_INDEX[SemanticType.RETRIEVED_CONTEXT]
QUESTION = TYPE_INDEX[SemanticType.USER_QUERY]


class RepurposeRegimeConfig(R.RegimeConfig):
    """``experiments/repurpose/repurpose_regimes.yaml``: ``workload`` holds the ``zipf_rag``
    parameters every setting starts from; an axis named ``capacity`` sets the cache, any
    other axis the workload parameter of its name."""

    #: the cache does not change the workload (:meth:`task_key` groups by the workload itself)
    shared_axes: ClassVar[tuple[str, ...]] = ("capacity",)
    workload: dict[str, Any] = Field(default_factory=dict)
    policy: str = "lru"
    model: str = "llama-3.1-8b"
    block_size: int = Field(default=16, ge=1, le=4096)

    @model_validator(mode="after")
    def _check_settings(self) -> RepurposeRegimeConfig:
        from skv.experiments.config import _flatten

        if set(self.policies) != set(MODES):
            raise ValueError(f"method and baselines: the two keyings {MODES}")
        for m in (self.metric, *self.secondary):
            if m not in METRICS:
                raise ValueError(f"metric {m!r}: a cell records {', '.join(METRICS)}")
        for where, setting in self.checked_settings():
            try:
                run, axes = effective(self, setting)
                workload_params(run, axes, 0)
                S.capacity_blocks(str(axes.get("capacity", "30GB")), block_size=run.block_size,
                                  model=run.model, total_blocks=1)  # fmt: skip
            except ValidationError as exc:
                raise ValueError(f"{where}: {_flatten(exc)}") from None
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self

    def cell_key(self, setting: dict[str, Any]) -> tuple[Any, ...]:
        """Everything :func:`cell` reads of a setting besides the seed: the workload
        (:func:`canonical_params`), block size, policy, model and capacity. Settings with equal
        keys give the same cell for every seed, so a sweep runs one of them: the two orders
        of one document (``docs_per_request`` 1) and a toggle equal to a grid setting."""
        run, axes = effective(self, setting)
        return (
            canonical_params(run, axes), run.block_size, run.policy, run.model,
            str(axes.get("capacity", "30GB")),
        )  # fmt: skip

    def task_key(self, setting: dict[str, Any]) -> tuple[Any, ...]:
        """Settings of one workload's draws (:func:`workload_layouts`' argument, the seed
        aside) share a task, so it is drawn once for all of them: the capacities, the layouts
        (``doc_order``, ``docs_first``), and toggles that change only the policy, the model or
        the block size."""
        run, axes = effective(self, setting)
        return (layout_free(canonical_params(run, axes)),)

    def run_key(self, setting: dict[str, Any]) -> tuple[Any, ...]:
        """Within a task, the settings of one workload and block size (:func:`keyed_traces`'
        arguments, the seed aside) run back to back, so it is compiled once for them."""
        run, axes = effective(self, setting)
        return (canonical_params(run, axes), run.block_size)


def effective(
    cfg: RepurposeRegimeConfig, setting: dict[str, Any]
) -> tuple[RepurposeRegimeConfig, dict[str, Any]]:
    """The config a setting runs (``cfg`` with its ``config.`` paths: the cell reads the
    policy, model, block size and workload from it) and the setting's axis values."""
    axes, paths = R.split_setting(setting)
    if not paths:
        return cfg, axes
    data = R.with_paths(cfg.model_dump(mode="json"), paths)
    data["toggles"] = None  # the toggled config is one run, not a map with toggles of its own
    return type(cfg).model_validate(data), axes


def workload_params(cfg: RepurposeRegimeConfig, setting: dict[str, Any], seed: int) -> Any:
    from skv.workloads.zipf_rag import ZipfRagParams

    over = {k: v for k, v in setting.items() if k != "capacity"}
    return ZipfRagParams(**{**cfg.workload, **over, "seed": seed})


def canonical_params(cfg: RepurposeRegimeConfig, setting: dict[str, Any]) -> str:
    """The setting's workload parameters as JSON, seed 0 (the seed is the same in every
    cell it is compared across) and ``doc_order`` ``retrieval`` when a request has one
    document: ``zipf_rag.chats`` then sorts a list of one (no random draw, nothing else reads
    the order), so both orders make the same requests. Equal strings: the same workload for
    every seed."""
    params = workload_params(cfg, setting, 0)
    if params.docs_per_request == 1:
        params = params.model_copy(update={"doc_order": "retrieval"})
    return params.model_dump_json()


@dataclass(frozen=True)
class Keyed:
    """One keying's compiled trace with what every replay of it reads: its totals
    (:func:`skv.replay.trace_totals`), :func:`head_share` and whether every request is one
    chain (``single``: prefix keying; a request without blocks is not), computed once
    (:func:`keyed`)."""

    trace: Any
    totals: Any
    head_share: float
    single: bool


def keyed(trace: Any) -> Keyed:
    from skv.replay import trace_totals

    totals = trace_totals(trace)
    # one block without a parent per request: what ``len(.study.chain_starts(...)[i]) == 1``
    # says, counted at C speed
    single = all(rb.parents.count(None) == 1 for rb in trace)
    return Keyed(trace, totals, head_share(trace, totals), single)


def replay(k: Keyed, policy: str, capacity: int) -> dict[str, float]:
    """One keying's replay (:func:`.study.replay_stats`: the cache's totals, equal to
    :func:`.study.chain_hits`'): the token hit rate and, for a request's leading hit run, how
    many of its tokens are document blocks and how many come before them (only where every
    request is one chain, else NaN).

    An ``lru`` cache with room for every unique block of the trace never evicts (it holds at
    most the keys seen so far, and an access caches its misses), so each chain hits its
    leading run of keys seen before: the infinite-cache ceiling of
    :func:`skv.replay.trace_totals`. Where only the hit tokens are read (not every request
    one chain: segment keying at 1 TB) they are that ceiling's, not replayed
    (:func:`no_eviction`).

    Where every request is one chain, its hit blocks are the leading run of its blocks that
    the cache holds (a block is cached only with its parent; nothing is evicted before the
    request's first miss, and its hits are pinned after it), so the document tokens of that
    run, summed over the requests, are the cache's hit tokens of document blocks
    (``hit_tokens_by_type``: counted per hit block by the block's type in the request)."""
    prompt = k.totals.prompt_tokens
    if not k.single:
        if no_eviction(k, policy, capacity):
            hit = k.totals.ceiling_hit_tokens
        else:
            hit = S.replay_stats(k.trace, policy, capacity).hit_tokens
        nan = float("nan")
        return {"token_hit_rate": hit / prompt, "doc_hit_rate": nan, "head_hit_rate": nan,
                "head_share": k.head_share}  # fmt: skip
    stats = S.replay_stats(k.trace, policy, capacity)
    hit = stats.hit_tokens
    doc_hits = stats.hit_tokens_by_type[DOC]
    return {
        "token_hit_rate": hit / prompt,
        "doc_hit_rate": doc_hits / prompt,
        "head_hit_rate": (hit - doc_hits) / prompt,
        "head_share": k.head_share,
    }


def no_eviction(k: Keyed, policy: str, capacity: int) -> bool:
    """Whether a replay of ``k`` at ``capacity`` blocks hits exactly the trace's ceiling
    (``k.totals.ceiling_hit_tokens``): ``lru`` with room for every unique block (:func:`replay`).
    A test compares both ways at capacities around the unique blocks."""
    return policy == "lru" and capacity >= k.totals.unique_blocks


def head_share(trace: Any, totals: Any) -> float:
    """The share of the prompt tokens (``totals``: :func:`skv.replay.trace_totals` of
    ``trace``) that are neither documents nor a request's question (its trailing run of
    user-query blocks): what precedes or follows the documents and can recur. A property of
    the workload and keying, not of the cache."""
    head = sum(totals.tokens_by_type) - totals.tokens_by_type[DOC]  # every block's tokens
    for rb in trace:
        stypes, tokens = rb.stypes, rb.tokens
        i = len(stypes) - 1
        while i >= 0 and stypes[i] == QUESTION:
            head -= tokens[i]
            i -= 1
    return head / totals.prompt_tokens


def layout_free(params_json: str) -> str:
    """``params_json`` (``ZipfRagParams``) with the default layout
    (:func:`skv.workloads.zipf_rag.without_layout`): equal strings, the same draws."""
    from skv.workloads.zipf_rag import ZipfRagParams, without_layout

    return without_layout(ZipfRagParams.model_validate_json(params_json)).model_dump_json()


@functools.lru_cache(maxsize=1)
def workload_layouts(draw_json: str) -> Any:
    """The draws of the workload ``draw_json`` (:func:`layout_free` parameters), laid out on
    request (:class:`skv.workloads.zipf_rag.Layouts`). The last one is kept: the cells of one
    task (:meth:`RepurposeRegimeConfig.task_key`) draw it once."""
    from skv.workloads.zipf_rag import Layouts, ZipfRagParams

    return Layouts(ZipfRagParams.model_validate_json(draw_json))


@functools.lru_cache(maxsize=1)
def workload_requests(params_json: str) -> list[Any]:
    """The requests of ``params_json`` (``ZipfRagParams``), equal to ``WORKLOADS["zipf_rag"]``'s
    (:class:`~skv.workloads.zipf_rag.Layouts`), from the draws of its :func:`layout_free`
    parameters. The last workload is kept: the cells of one workload build it once, whatever
    their block sizes."""
    from skv.workloads.zipf_rag import ZipfRagParams

    params = ZipfRagParams.model_validate_json(params_json)
    return workload_layouts(layout_free(params_json)).requests(params)


@functools.lru_cache(maxsize=1)
def keyed_traces(params_json: str, block_size: int) -> dict[str, Keyed]:
    """The workload of ``params_json`` (:func:`workload_requests`) compiled under each keying.
    The last one is kept: the cells of one workload and block size compile it once. Compiled
    with the cyclic collector paused (:func:`skv.runtime.no_cyclic_gc`, as the workload's
    generation and the replay are): its collections walked the requests and blocks again and
    again, about a tenth of a cell's time; what compiling drops is freed by reference
    counting."""
    from skv.replay import compile_trace
    from skv.runtime import no_cyclic_gc

    requests = workload_requests(params_json)
    with no_cyclic_gc():
        return {m: keyed(compile_trace(requests, block_size=block_size, mode=m)) for m in MODES}


def cell(
    cfg: RepurposeRegimeConfig, setting: dict[str, Any], seed: int
) -> dict[str, dict[str, float]]:
    run, axes = effective(cfg, setting)
    params = workload_params(run, axes, seed).model_dump_json()
    out = {}
    for mode, k in keyed_traces(params, run.block_size).items():
        cap = S.capacity_blocks(
            str(axes.get("capacity", "30GB")), block_size=run.block_size, model=run.model,
            total_blocks=k.totals.block_accesses,
        )  # fmt: skip
        out[mode] = replay(k, run.policy, cap)
    return out


def load(path: str | Path, *, quick: bool) -> RepurposeRegimeConfig:
    return R.load_config(path, RepurposeRegimeConfig, quick=quick)


def decomposition(cfg: RepurposeRegimeConfig, rows: Any) -> Any:
    """Per setting, prefix keying's token hit rate and its two parts (mean over seeds, in
    percent): hits before the documents (head) and on documents, beside the head's share of
    the prompt and segment keying's hit rate."""
    import pandas as pd

    axes = list(cfg.axes)
    pre = rows[rows["policy"] == "prefix"].groupby(axes, sort=False, observed=True)
    seg = rows[rows["policy"] == "segment"].groupby(axes, sort=False, observed=True)
    out = pd.DataFrame(
        {
            "prefix_hit_pct": 100 * pre["token_hit_rate"].mean(),
            "prefix_head_hit_pct": 100 * pre["head_hit_rate"].mean(),
            "prefix_doc_hit_pct": 100 * pre["doc_hit_rate"].mean(),
            "head_share_pct": 100 * pre["head_share"].mean(),
            "segment_hit_pct": 100 * seg["token_hit_rate"].mean(),
        }
    )
    return out.reset_index()


def claim_values(cfg: RepurposeRegimeConfig, rows: Any, table: Any) -> dict[str, Any]:
    """The map's values (:func:`skv.experiments.regimes.claim_values`) and, at the capacity
    study's setting (``study_setting``), prefix keying's hit rate and its head and document
    parts per seed (``study_prefix_{hit,head,doc}_pts``: Student t over seeds, in points) and
    the head's share of the prompt (``study_head_share_pct``)."""
    from skv.experiments.stats import interval

    values = R.claim_values(cfg, rows, table)
    at = {k: R.axis_label(v) for k, v in STUDY_SETTING.items() if k in cfg.axes}
    d = rows[rows["policy"] == "prefix"]
    for k, v in at.items():
        d = d[d[k] == v]
    if len(d) and len(at) == len(cfg.axes):
        d = d.sort_values("seed")
        for name, col in (("hit", "token_hit_rate"), ("head", "head_hit_rate"),
                          ("doc", "doc_hit_rate")):  # fmt: skip
            values[f"study_prefix_{name}_pts"] = interval(list(100 * d[col].to_numpy(float)))
        values["study_head_share_pct"] = interval(list(100 * d["head_share"].to_numpy(float)))
        values["study_setting"] = ", ".join(f"{k} {v}" for k, v in at.items())
        head = 100 * d["head_hit_rate"].to_numpy(float)
        values["study_prefix_head_of_hit"] = interval(list(head / (100 * d["token_hit_rate"])))
    return values


#: the capacity study's setting (``repurpose_capacity.yaml`` at its claim capacity)
STUDY_SETTING: dict[str, Any] = {
    "capacity": "30GB",
    "fixed_prefix_fraction": 0.2,
    "docs_per_request": 4,
    "docs_first": False,
    "doc_order": "retrieval",
}
