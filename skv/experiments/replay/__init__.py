"""The real-trace study: Mooncake and Claude Code traces replayed through the caches.

``capacity`` (hit rate against capacity, reuse by semantic type; cache-only), ``session_gap``
(how the Claude Code results depend on the assumed gap between sessions), ``oracles`` (exact
ceilings computed from a trace without a cache), ``timed`` (a trace through the serving
simulator with a latency model) and ``cli`` (``skv replay``). Configs in
``experiments/replay/``, notebooks in ``notebooks/replay/``.
"""
