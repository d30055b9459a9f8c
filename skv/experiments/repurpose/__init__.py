"""KV-Repurpose study (issue 13, simulated part): segment-wise reuse vs prefix caching.

The ``zipf_rag`` workload (documents drawn Zipf from a corpus, behind varying system prompts and
histories; 20% of requests one fixed prefix) is keyed twice, ``prefix`` and ``segment``
(:mod:`skv.blocks`), and replayed through the same cache and policy (``lru``) at byte
capacities of the llama-3.1-8b preset (131,072 B/token): 10 GB to 1 TB and an infinite cache.
Each mode's trace is compiled once and every capacity replays it (no per-capacity copies).

- :mod:`.study`: the config (a pydantic model with bounds, ``quick:`` overrides), the sweep
  (token hit rate = reused prompt tokens / prompt tokens, per mode and capacity, the analytic
  prefix ceiling :func:`skv.workloads.zipf_rag.prefix_ceiling`) and the TTFT estimate with
  recompute (naive, EPIC-like, CacheBlend-like), and the figures.

Not here (issue 13, later): the real-model quality probe and the real-engine comparison.
"""
