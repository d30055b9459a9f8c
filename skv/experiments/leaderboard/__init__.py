"""The policy leaderboard: every registered online policy on every trace with block ids, at four
capacities, as the share of the LRU -> Belady gap it closes (``study.py``), with an equal tuning
budget per policy on workloads the evaluation never sees (``tuning.py``).
"""
