"""``zipf_rag``: KV-Repurpose's Zipfian RAG workload, documents behind varying prefixes.

Every request is ``[system prompt][history][k documents][question]``. The documents are drawn
Zipf-popular from a fixed corpus and are the identical text (same content hash) in every request
that retrieves them, so segment keying (``mode="segment"``) finds a document behind any prefix;
prefix keying finds it only behind the same system prompt, the same history and the same
documents before it. A ``fixed_prefix_fraction`` (KV-Repurpose: 20%) of requests start with one
fixed prefix (system prompt, no history) instead of a drawn system prompt and history.

How the defaults were chosen (from the setting's structure, none fitted to a hit rate):

- ``fixed_prefix_fraction`` 0.2: the paper's share of requests with one fixed prefix.
- ``corpus_size`` 10,000 documents of ``doc_tokens`` 512 (lognormal spread ``length_sigma``
  0.5, fixed per document): a 512-token chunk is the common RAG chunk size, and a corpus of
  about 5M tokens holds ~670 GB of Llama-3.1-8B KV, so the swept capacities (10 GB to 1 TB)
  run from "a few hundred popular documents fit" to "the whole corpus fits".
- ``zipf_alpha`` 1.0: Zipf's law for document popularity (the classic exponent, and the
  ``rag`` workload's default).
- ``docs_per_request`` 4: a typical top-k of a retriever (and ``rag``'s default).
- ``num_system_prompts`` 8 of ``system_tokens`` 512, ``num_histories`` 32 of
  ``history_tokens`` 256 (one earlier user/assistant exchange): the documents follow one of
  8 x 32 = 256 distinct prefixes, a few deployed prompts times a handful of conversation
  states each. That the prefix varies at all, not its exact count, is the structure under test;
  the study's sensitivity figure varies it.
- ``fixed_prefix_tokens`` 1024 (``rag``'s shared prefix), ``question_tokens`` 64,
  ``output_tokens`` 128: short unique questions and answers, as in ``rag``.
- ``num_requests`` 10,000: enough that the top documents recur thousands of times and the tail
  still brings new documents at the end of the trace.

:func:`prefix_ceiling` is the expected share of prompt tokens prefix keying can ever hit (an
infinite cache), computed from these parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from skv.model import Request
from skv.runtime import no_cyclic_gc
from skv.workloads.base import (
    MAX_CATALOGUE,
    MAX_PER_REQUEST,
    Chat,
    Context,
    Fraction,
    Message,
    TextGen,
    Tokens,
    WorkloadParams,
    ZipfSampler,
    check_order,
    draw_length,
    poisson_arrivals,
    rng_for,
)

NAME = "zipf_rag"


class ZipfRagParams(WorkloadParams):
    """Parameters of ``zipf_rag`` (plus those of :class:`WorkloadParams`)."""

    num_requests: int = Field(default=10_000, ge=1, le=1_000_000)
    length_sigma: float = Field(default=0.5, ge=0, le=2)
    corpus_size: int = Field(
        default=10_000, ge=1, le=MAX_CATALOGUE, description="documents in the corpus"
    )
    doc_tokens: int = Tokens(512, "mean document length (lognormal, fixed per document)")
    docs_per_request: int = Field(
        default=4, ge=1, le=MAX_PER_REQUEST, description="distinct documents per request (k)"
    )
    zipf_alpha: float = Field(
        default=1.0, ge=0, le=5, description="popularity skew: P(doc i) ~ 1/(i+1)**alpha"
    )
    num_system_prompts: int = Field(
        default=8, ge=1, le=MAX_CATALOGUE, description="system-prompt variants (uniform)"
    )
    system_tokens: int = Tokens(512, "mean system-prompt length")
    num_histories: int = Field(
        default=32,
        ge=1,
        le=MAX_CATALOGUE,
        description="history variants (one earlier exchange) after the system prompt (uniform)",
    )
    history_tokens: int = Tokens(256, "mean history length (user + assistant turn)")
    fixed_prefix_fraction: float = Fraction(
        0.2, "share of requests that start with the one fixed prefix (no history)"
    )
    fixed_prefix_tokens: int = Tokens(1024, "length of the fixed prefix")
    question_tokens: int = Tokens(64, "mean question length (unique per request)")
    output_tokens: int = Tokens(128, "mean answer length")
    #: the documents in the retriever's order (popular ones tend to come first) or sorted by
    #: id (a canonical order: the same set of documents is the same token sequence)
    doc_order: Literal["retrieval", "sorted"] = "retrieval"
    #: the documents before the varying system prompt and history instead of after them (a
    #: fixed-prefix request keeps its fixed prefix first: it does not vary)
    docs_first: bool = False

    @model_validator(mode="after")
    def _docs_fit(self) -> ZipfRagParams:
        check_order(self, "docs_per_request", "corpus_size")
        return self


def document(tg: TextGen, doc_id: int, p: ZipfRagParams) -> str:
    """Document ``doc_id``: ``Document <id>: <text>``, the same string in every request."""
    return tg.join(
        f"Document {doc_id}:", tg.text(f"{NAME}/doc", doc_id, p.doc_tokens, p.length_sigma)
    )


#: per process, :func:`document_tokens`' longest array per (seed, doc_tokens, length_sigma)
_DOC_TOKENS: dict[tuple[int, int, float], np.ndarray] = {}


def document_tokens(p: ZipfRagParams) -> np.ndarray:
    """Token count of every document as :func:`document` writes it, without writing it: the
    label's tokens plus the length :meth:`TextGen.text` draws first from the document's stream.

    Document ``d``'s count is a function of ``(seed, d, doc_tokens, length_sigma)`` alone (its
    label and its own stream ``rng_for(seed, kind, d)``), not of the corpus size or any other
    parameter: the longest array made per ``(seed, doc_tokens, length_sigma)`` is kept (a few
    per process) and a copy of its first ``corpus_size`` counts returned."""
    key = (p.seed, p.doc_tokens, p.length_sigma)
    have = _DOC_TOKENS.get(key)
    if have is None or len(have) < p.corpus_size:
        if len(_DOC_TOKENS) >= 8:
            _DOC_TOKENS.clear()
        have = _DOC_TOKENS[key] = _document_tokens(*key, p.corpus_size)
    return have[: p.corpus_size].copy()


def _document_tokens(seed: int, doc_tokens: int, sigma: float, n: int) -> np.ndarray:
    """:func:`document_tokens` of documents ``0 .. n - 1``, made anew."""
    from skv.tokenize import SimpleTokenizer

    count = SimpleTokenizer().count
    kind = f"{NAME}/doc"
    return np.array(
        [
            count(f"Document {d}:") + draw_length(rng_for(seed, kind, d), doc_tokens, sigma)
            for d in range(n)
        ]
    )


def _system(tg: TextGen, k: int, p: ZipfRagParams) -> str:
    return tg.text(f"{NAME}/system", k, p.system_tokens, p.length_sigma)


def _history(tg: TextGen, k: int, p: ZipfRagParams) -> tuple[str, str]:
    n = max(2, p.history_tokens)
    return (
        tg.text(f"{NAME}/history_user", k, n // 2, p.length_sigma),
        tg.text(f"{NAME}/history_assistant", k, n - n // 2, p.length_sigma),
    )


def chats(params: ZipfRagParams, ctx: Context) -> list[Chat]:
    """Single-turn RAG requests, Poisson arrivals at ``rate_rps``.

    Messages: with probability ``fixed_prefix_fraction`` ``[fixed system, user]``, else
    ``[system s, user h, assistant h, user]`` with ``s`` uniform over ``num_system_prompts``
    and ``h`` uniform over ``num_histories``. The last user message holds
    ``docs_per_request`` distinct documents drawn Zipf(``zipf_alpha``) in draw order (popular
    documents tend to come first, as a retriever's ranking; ``doc_order="sorted"``: by id), then
    ``Question: ...``. With ``docs_first`` a drawn-prefix request is ``[user documents, system
    s, user h, assistant h, user question]`` instead. ``extra``: ``doc_ids`` and ``prefix``
    (``"fixed"`` or ``"s/h"``).

    The random draws (:func:`draws`) do not depend on the layout (``doc_order``,
    ``docs_first``), which :func:`laid_out` applies to them.
    """
    return laid_out(draws(params, ctx), params)


@dataclass(frozen=True, slots=True)
class Drawn:
    """One request of :func:`chats` before its layout: its head messages (the fixed prefix,
    or system prompt and history), its documents in draw order, the question and its answer's
    length."""

    request_id: str
    arrival_s: float
    head: tuple[Message, ...]
    variant: str
    doc_ids: list[int]
    sections: tuple[str, ...]
    asked: str
    output_tokens: int


def draws(params: ZipfRagParams, ctx: Context) -> list[Drawn]:
    """Every random draw of :func:`chats`, in its order; ``params.doc_order`` and
    ``params.docs_first`` are not read."""
    p = params
    tg = ctx.textgen
    rng = rng_for(p.seed, NAME, "content")
    arrivals = poisson_arrivals(rng_for(p.seed, NAME, "arrivals"), p.num_requests, p.rate_rps)
    zipf = ZipfSampler(p.corpus_size, p.zipf_alpha)
    fixed = Message("system", (tg.text(f"{NAME}/fixed_prefix", 0, p.fixed_prefix_tokens),))
    systems = [Message("system", (_system(tg, k, p),)) for k in range(p.num_system_prompts)]
    histories: dict[int, tuple[Message, Message]] = {}
    docs: dict[int, str] = {}
    out = []
    for i, t in enumerate(arrivals):
        if rng.random() < p.fixed_prefix_fraction:
            head, variant = (fixed,), "fixed"
        else:
            s = int(rng.integers(0, p.num_system_prompts))
            h = int(rng.integers(0, p.num_histories))
            hist = histories.get(h)
            if hist is None:
                u, a = _history(tg, h, p)
                hist = histories[h] = (Message("user", (u,)), Message("assistant", (a,)))
            head, variant = (systems[s], *hist), f"{s}/{h}"
        doc_ids = zipf.sample_distinct(rng, p.docs_per_request)
        sections: list[str] = []
        for d in doc_ids:
            text = docs.get(d)
            if text is None:
                text = docs[d] = document(tg, d, p)
            sections.append(text)
        question = tg.fresh(rng, draw_length(rng, p.question_tokens, p.length_sigma))
        asked = tg.join("Question:", question)
        out.append(
            Drawn(
                request_id=f"{ctx.id_prefix}{NAME}-{i:06d}",
                arrival_s=ctx.time_offset_s + t,
                head=head,
                variant=variant,
                doc_ids=doc_ids,
                sections=tuple(sections),
                asked=asked,
                output_tokens=draw_length(rng, p.output_tokens, p.length_sigma),
            )
        )
    return out


#: the parameters :func:`laid_out` reads and :func:`draws` does not
LAYOUT_FIELDS = ("doc_order", "docs_first")


def without_layout(params: ZipfRagParams) -> ZipfRagParams:
    """``params`` with the default layout (:data:`LAYOUT_FIELDS` at their defaults): equal for
    every layout of one draw."""
    fields = ZipfRagParams.model_fields
    return params.model_copy(update={f: fields[f].default for f in LAYOUT_FIELDS})


def laid_out(drawn: list[Drawn], params: ZipfRagParams) -> list[Chat]:
    """The chats of :func:`draws` in ``params``' layout (``doc_order``, ``docs_first``; no
    other field is read). Each chat has its own ``doc_ids`` list, so one draw can be laid out
    several ways."""
    by_id = params.doc_order == "sorted"
    docs_first = params.docs_first
    out = []
    for d in drawn:
        doc_ids, sections = d.doc_ids, d.sections
        if by_id:  # the ids are distinct: one order
            order = sorted(range(len(doc_ids)), key=doc_ids.__getitem__)
            doc_ids = [doc_ids[j] for j in order]
            sections = tuple(sections[j] for j in order)
        else:
            doc_ids = list(doc_ids)
        if docs_first and d.variant != "fixed":
            messages = [Message("user", sections), *d.head, Message("user", (d.asked,))]
        else:
            messages = [*d.head, Message("user", (*sections, d.asked))]
        out.append(
            Chat(
                request_id=d.request_id,
                arrival_s=d.arrival_s,
                messages=messages,
                output_tokens=d.output_tokens,
                extra={"doc_ids": doc_ids, "prefix": d.variant},
            )
        )
    return out


class Layouts:
    """The requests of one ``zipf_rag`` workload in each layout (``doc_order``,
    ``docs_first``), drawn once: ``requests(p)`` equals ``WORKLOADS["zipf_rag"](p)`` for every
    ``p`` that differs from ``params`` in those two fields at most (the same context and
    rendering as the registry's; a test compares them). Its renderer's section cache is
    shared by the layouts (the same texts, laid out differently)."""

    def __init__(self, params: ZipfRagParams) -> None:
        self.params = params
        self.ctx = Context.for_params(params)
        with no_cyclic_gc():
            self.drawn = draws(params, self.ctx)

    def requests(self, params: ZipfRagParams) -> list[Request]:
        """The requests of ``params``, a layout of this workload."""
        if without_layout(params) != without_layout(self.params):
            raise ValueError("Layouts.requests: parameters other than the layout differ")
        with no_cyclic_gc():
            return self.ctx.renderer.render(laid_out(self.drawn, params))


# ----------------------------------------------------------------------------------------
# the structural ceiling of prefix reuse


def _expected_repeats(q: np.ndarray, n: int) -> np.ndarray:
    """E[max(0, X - 1)] for X ~ Binomial(n, q): requests that find a path already seen."""
    return n * q + np.expm1(n * np.log1p(-np.minimum(q, 1 - 1e-16)))


def _floor_block(tokens: np.ndarray | int, block_size: int) -> np.ndarray | int:
    return (np.asarray(tokens) // block_size) * block_size


def prefix_ceiling(
    params: ZipfRagParams, *, block_size: int = 16, pair_docs: int = 256
) -> dict[str, float]:
    """Expected share of prompt tokens that prefix keying can ever hit (infinite cache).

    A request hits, under prefix keying, the longest run of whole segments it shares from its
    start with an earlier request, cut down to whole blocks (block boundaries are fixed over
    the prompt; the block that straddles the first difference misses). The shared run is a
    path in the tree fixed prefix / system prompt -> history -> first document -> second
    document ...; a path node of per-request probability ``q`` is found already cached by
    ``E[max(0, Binomial(N, q) - 1)]`` requests, and each contributes the node's tokens
    (in whole blocks). Documents are drawn in order with ``P(first = d) = p_d`` and
    ``P(second = e | first = d) = p_e / (1 - p_d)`` (:meth:`ZipfSampler.sample_distinct`).
    Terms: prefix nodes and first documents exactly; second documents over the ``pair_docs``
    most popular documents; deeper documents are left out (each path of three documents is
    rarer than ``1 / N`` at the defaults; the test states the tolerance this leaves). Token
    counts are the workload's own (the same seeded texts), so this is exact per seed up to
    those truncations.
    """
    p = params
    if p.doc_order != "retrieval" or p.docs_first:
        raise ValueError(
            "prefix_ceiling models the documents in retrieval order after the prefix "
            f"(doc_order 'retrieval', docs_first false), got {p.doc_order!r}, {p.docs_first}"
        )
    n = p.num_requests
    tg = TextGen(p.seed)
    from skv.tokenize import SimpleTokenizer

    count = SimpleTokenizer().count

    def tokens(text: str) -> int:
        got = tg.counts.get(text)
        return count(text) if got is None else got

    fixed_len = tokens(tg.text(f"{NAME}/fixed_prefix", 0, p.fixed_prefix_tokens))
    sys_len = np.array([tokens(_system(tg, k, p)) for k in range(p.num_system_prompts)])
    hist_len = np.array(
        [sum(tokens(x) for x in _history(tg, h, p)) for h in range(p.num_histories)]
    )
    zipf = ZipfSampler(p.corpus_size, p.zipf_alpha)
    probs = zipf.probs
    doc_len = document_tokens(p)
    f = p.fixed_prefix_fraction
    k = min(p.docs_per_request, p.corpus_size)

    # expected prompt tokens per request
    mean_doc_tokens = _expected_doc_tokens(probs, doc_len, k)
    q_len = p.question_tokens + 1  # "Question:" label; draw_length keeps the mean
    prompt = f * fixed_len + (1 - f) * (sys_len.mean() + hist_len.mean()) + mean_doc_tokens + q_len

    bs = block_size
    hits = 0.0
    # prefix nodes: the fixed prefix, each system prompt, each (system prompt, history)
    q_sys = (1 - f) / p.num_system_prompts
    q_var = q_sys / p.num_histories
    hits += float(_expected_repeats(np.array([f]), n)[0]) * _floor_block(fixed_len, bs)
    hits += float(
        (_expected_repeats(np.full(len(sys_len), q_sys), n) * _floor_block(sys_len, bs)).sum()
    )
    var_len = (sys_len[:, None] + hist_len[None, :]).ravel()
    hits += float(
        (
            _expected_repeats(np.full(len(var_len), q_var), n)
            * (_floor_block(var_len, bs) - np.repeat(_floor_block(sys_len, bs), p.num_histories))
        ).sum()
    )
    # documents behind each prefix variant (the fixed prefix and every (s, h))
    heads = [(f, np.array([fixed_len])), (q_var, var_len)]
    m = min(pair_docs, p.corpus_size)
    for q_head, lens in heads:
        if q_head <= 0:
            continue
        # first document: node (head, d)
        q1 = q_head * probs
        rep1 = _expected_repeats(q1, n)
        l1 = lens[:, None] + doc_len[None, :]
        hits += float(
            (rep1[None, :] * (_floor_block(l1, bs) - _floor_block(lens, bs)[:, None])).sum()
        )
        if k >= 2 and m >= 2:
            # second document over the m most popular: node (head, d, e)
            pd, pe = probs[:m], probs[:m]
            q2 = q_head * pd[:, None] * pe[None, :] / (1 - pd[:, None])
            np.fill_diagonal(q2, 0.0)
            rep2 = _expected_repeats(q2, n)
            np.fill_diagonal(rep2, 0.0)
            ld = doc_len[:m]
            for base in lens:
                a = base + ld[:, None]
                b = a + ld[None, :]
                hits += float((rep2 * (_floor_block(b, bs) - _floor_block(a, bs))).sum())
    total = n * prompt
    return {
        "prefix_ceiling": float(hits / total),
        "expected_prompt_tokens": float(prompt),
        "expected_hit_tokens": float(hits),
    }


def _expected_doc_tokens(probs: np.ndarray, doc_len: np.ndarray, k: int) -> float:
    """E[tokens of k distinct Zipf documents drawn in order] (exact for k = 1, 2; the rest by
    the inclusion probabilities of successive sampling, approximated by 1 - (1 - p)^(k')
    with k' chosen so they sum to k)."""
    if k >= len(probs):
        return float(doc_len.sum())
    # inclusion probability pi_d with sum pi_d = k: pi_d = 1 - (1 - p_d)^t, t solved by bisection
    lo, hi = 0.0, 1.0
    while (1 - np.power(1 - probs, hi)).sum() < k:
        hi *= 2
    for _ in range(100):
        t = (lo + hi) / 2
        if (1 - np.power(1 - probs, t)).sum() < k:
            lo = t
        else:
            hi = t
    pi = 1 - np.power(1 - probs, (lo + hi) / 2)
    return float((pi * doc_len).sum()) if math.isfinite(lo) else float(k * doc_len.mean())
