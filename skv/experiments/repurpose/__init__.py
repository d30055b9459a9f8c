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
- :mod:`.sensitivity`: the same two keyings at the one claim capacity (30 GB) as one workload
  parameter at a time moves around its default (Zipf alpha, corpus size, k documents per
  request, fixed-prefix share), with the analytic prefix ceiling and the infinite-cache replay
  per setting, and its figure.
- :mod:`.engine`: the same workload on a real vLLM engine (stock prefix caching, a cache that
  evicts): measured hits against skv's prefix-mode simulation request by request, with segment
  keying's simulated rate beside it (stock vLLM has no segment reuse).
"""
