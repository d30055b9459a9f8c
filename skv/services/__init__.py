"""OpenAI-compatible services around skv: a mock engine, a telemetry proxy (and trace collection,
``collect``), a cache-locality router and a simulation API (``skv services mock | proxy | router
| sim-api | demo-router``). Shared parts: ``_common`` (env, errors, JSONL appender), ``checks``
(every request's 4xx checks, the body limit), ``relay`` (forwarding to an upstream with
connect / first-byte / total timeouts).

All of them are observability or routing layers: none controls a backend's KV-cache admission
or eviction. Every service binds 127.0.0.1 unless told otherwise.

Settings come from ``SKV_*`` environment variables; the seed project's ``SEMANTICKV_*`` names
(``SEMANTICKV_UPSTREAM_BASE_URL``, ``SEMANTICKV_REPLICAS``, ...) are read as deprecated aliases
(``skv.services._common.env_raw``: one warning per name; the ``SKV_`` name wins).
"""
