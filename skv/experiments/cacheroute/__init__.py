"""CacheRoute study (issue 14): routers on a simulated 15-replica cluster, max QPS at a p99 TTFT
SLO, p99 TTFT against load, and the counterexamples where affinity can lose.

- :mod:`.workloads`: seeded cluster workloads at any offered rate (aggregate, dominant_key,
  shifting_skew, mooncake), hash-id requests with common random numbers across rates;
- :mod:`.cluster`: the cluster spec (KV capacity from the memory left after the weights), one
  load point with a time-based warm-up, and the bisection search for max QPS at the SLO;
- :mod:`.study`: configs (``experiments/cacheroute/*.yaml``), the sweeps through the sweep
  executor (:mod:`skv.experiments.sweep`), the summary table, claim values and figures.

The two-engine real-vLLM routing experiment is :mod:`skv.experiments.routing`, and the
shadow-replay gate is :mod:`skv.experiments.replay.shadow` (``skv shadow``).
"""
