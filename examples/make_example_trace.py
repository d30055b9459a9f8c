"""Regenerate ``examples/traces/rag_serving_trace.jsonl``: a small replayable trace made by skv.

It is skv's own mock collection (``skv collect-mock``), not data copied from anywhere: seeded
chat, RAG and tool-agent sessions served by ``skv.services.collect.MockHandler`` (a prefix cache plus a
linear TTFT model with 3% jitter) through a ``TraceCollector`` that segments every prompt and
keeps only content hashes, token counts, semantic labels and timing (redacted). Its
``observed_ttft_ms`` values are therefore SIMULATED by the mock's model (base 30 ms, 0.12 ms per
uncached token, 0.01 ms per cached token), which makes the file a known-answer test for
``skv replay --calibrate-from-trace``.

    python examples/make_example_trace.py            # rewrites the file (deterministic)
    skv replay examples/traces/rag_serving_trace.jsonl --cache-token-budget 50000 \\
        --policies lru adaptive_semantic static_semantic --calibrate-from-trace
"""

from __future__ import annotations

import sys
from pathlib import Path

from skv.services.collect import MockHandler, collect_mock

HERE = Path(__file__).resolve().parent
OUT = HERE / "traces" / "rag_serving_trace.jsonl"
REQUESTS = 120
SEED = 7


def main(out: Path = OUT) -> Path:
    handler = MockHandler(seed=SEED, cache_tokens=40_000)
    reqs = collect_mock(
        REQUESTS,
        out,
        seed=SEED,
        redact=True,
        handler=handler,
        session_rate_rps=0.8,
        kinds=("rag", "rag", "chat", "agent"),
        num_docs=48,
        doc_words=(300, 900),
        meta={"generated_by": "examples/make_example_trace.py"},
    )
    print(f"wrote {len(reqs)} requests to {out} ({out.stat().st_size / 1024:.1f} KiB)")
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
