"""Scrape a vLLM server's Prometheus ``/metrics`` and read its prefix-cache counters.

vLLM V1 counts, per engine, the prompt tokens it looked up in the prefix cache
(``vllm:prefix_cache_queries_total``) and those it found (``vllm:prefix_cache_hits_total``). Both
are cumulative since start, so a hit rate over a stretch of work is the ratio of their deltas:

    before = scrape_prefix_cache(url)
    ...  # send requests
    after = scrape_prefix_cache(url)
    print((after - before).hit_rate)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"

Sample = tuple[dict[str, str], float]


def parse_prometheus(text: str) -> dict[str, list[Sample]]:
    """Parse the Prometheus text exposition format: metric name -> [(labels, value)].
    Comments (``# HELP``, ``# TYPE``) are skipped; timestamps are dropped."""
    out: dict[str, list[Sample]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, labels, rest = _split_sample(line)
        if name is None:
            continue
        fields = rest.split()
        if not fields:
            continue
        try:
            value = _float(fields[0])
        except ValueError:
            continue
        out.setdefault(name, []).append((labels, value))
    return out


def _float(s: str) -> float:
    low = s.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(s)


def _split_sample(line: str) -> tuple[str | None, dict[str, str], str]:
    brace = line.find("{")
    space = line.find(" ")
    if brace == -1 or (space != -1 and space < brace):
        if space == -1:
            return None, {}, ""
        return line[:space], {}, line[space + 1 :]
    name = line[:brace]
    labels: dict[str, str] = {}
    i = brace + 1
    n = len(line)
    while i < n:
        while i < n and line[i] in " ,":
            i += 1
        if i < n and line[i] == "}":
            return name, labels, line[i + 1 :]
        eq = line.find("=", i)
        if eq == -1:
            return None, {}, ""
        key = line[i:eq].strip()
        i = eq + 1
        if i >= n or line[i] != '"':
            return None, {}, ""
        i += 1
        val: list[str] = []
        while i < n and line[i] != '"':
            if line[i] == "\\" and i + 1 < n:
                nxt = line[i + 1]
                val.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
            else:
                val.append(line[i])
                i += 1
        labels[key] = "".join(val)
        i += 1  # closing quote
    return None, {}, ""


def metric_sum(metrics: dict[str, list[Sample]], name: str, **match: str) -> float | None:
    """Sum of a metric's samples whose labels include ``match`` (None if it is absent)."""
    samples = [
        v
        for labels, v in metrics.get(name, [])
        if all(labels.get(k) == m for k, m in match.items())
    ]
    return sum(samples) if samples else None


@dataclass(frozen=True)
class PrefixCacheCounters:
    """Cumulative prefix-cache lookups and hits, in tokens (summed over engines)."""

    queries: float
    hits: float

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None

    def __sub__(self, other: PrefixCacheCounters) -> PrefixCacheCounters:
        return PrefixCacheCounters(self.queries - other.queries, self.hits - other.hits)


def prefix_cache_counters(
    text_or_metrics: str | dict[str, list[Sample]], **match: str
) -> PrefixCacheCounters:
    """The prefix-cache counters from ``/metrics`` text (or its parse); 0 when absent (vLLM
    exports them only once the first request has been scheduled on some versions)."""
    m = parse_prometheus(text_or_metrics) if isinstance(text_or_metrics, str) else text_or_metrics
    return PrefixCacheCounters(
        queries=metric_sum(m, QUERIES, **match) or 0.0,
        hits=metric_sum(m, HITS, **match) or 0.0,
    )


def hit_rate(before: PrefixCacheCounters, after: PrefixCacheCounters) -> float | None:
    """Hits over queries between two scrapes (None when nothing was queried in between)."""
    return (after - before).hit_rate


def scrape(base_url: str, *, timeout: float = 30.0, client: httpx.Client | None = None) -> str:
    """GET ``/metrics`` and return its text."""
    url = base_url.rstrip("/") + "/metrics"
    if client is not None:
        resp = client.get(url, timeout=timeout)
    else:
        resp = httpx.get(url, timeout=timeout)
    resp.raise_for_status()
    return resp.text


async def ascrape(
    base_url: str, *, timeout: float = 30.0, client: httpx.AsyncClient | None = None
) -> str:
    """:func:`scrape` for async code."""
    url = base_url.rstrip("/") + "/metrics"
    if client is not None:
        resp = await client.get(url, timeout=timeout)
    else:
        async with httpx.AsyncClient() as c:
            resp = await c.get(url, timeout=timeout)
    resp.raise_for_status()
    return resp.text


def scrape_prefix_cache(base_url: str, **kw) -> PrefixCacheCounters:
    """Scrape ``/metrics`` and return the prefix-cache counters."""
    return prefix_cache_counters(scrape(base_url, **kw))


async def ascrape_prefix_cache(base_url: str, **kw) -> PrefixCacheCounters:
    return prefix_cache_counters(await ascrape(base_url, **kw))
