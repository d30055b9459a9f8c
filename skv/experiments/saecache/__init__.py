"""The SAECache study (issue 12): the four-queue ``saecache`` policy against vLLM's block pool
and the other baselines on SAECache-style traffic, in the serving simulator (every TTFT is
simulated: one A40 running Qwen2.5-1.5B under the roofline latency model); configs in
``experiments/saecache/``, notebooks in ``notebooks/saecache/``.

- ``study``: runs configs (the grid of ``experiments/saecache/grid/``: 7 workloads x 2
  intervals between new conversations; the ablation and fixed-parameter mismatch configs of
  ``experiments/saecache/ablation/``) with :func:`skv.experiments.runner.simulate_experiment`,
  several at a time in worker processes; fits ``saecache_fixed`` on another workload;
  simulates one cell to get a policy's full metric series (the runner keeps only ``w_*``).
- ``numbers``: the values the claims check, as paired per-seed statistics (TTFT speedups over
  ``vllm``, hit-rate differences against a named baseline, ablation and mismatch effects), each
  as ``{"value", "ci95", "n"}`` (:func:`skv.experiments.stats.interval`).
- ``reuse``: reuse rate by token type (an unbounded cache) beside the paper's table.
- ``figures``: the study's figures (TTFT speedups, hit rate against the strongest baseline,
  ablation and mismatch, learned parameters over time).

Quick runs keep the first :data:`~skv.experiments.saecache.study.QUICK_SEEDS` seeds and the
first :data:`~skv.experiments.saecache.study.QUICK_REQUESTS` requests of every config.
"""
