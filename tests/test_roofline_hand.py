"""Roofline latency worked out by hand from the presets' datasheet numbers.

Every expected value below is arithmetic on literal numbers (model presets in skv/sizing.py, GPU
presets in skv/latency/gpus.py, default mfu 0.5, mbu 0.8, overhead 1 ms, all-reduce latency
0.01 ms), not on anything the model computes, so a changed term shows up as a wrong number:

    compute_ms = [2 P tokens + 4 L H (sum_chunks t (c + t/2) + sum_decode ctx)] / (tp F mfu)
    memory_ms  = [P w + kv (sum_chunks (c + t) + sum_decode ctx)] / (tp B mbu)
    comm_ms    = 2 L (0.01 + 2 (tp - 1)/tp * tokens * H * 2 B / (link / 2))   if tp > 1
    total      = max(compute_ms, memory_ms) + comm_ms + 1

with kv = 2 * layers * kv_heads * head_dim * kv_dtype_bytes bytes per token.
"""

from __future__ import annotations

import pytest

from skv.latency import Iteration, PrefillChunk, RooflineLatency


def approx(x: float):
    return pytest.approx(x, rel=1e-12)


def test_a_decode_batch_is_memory_bound_and_costs_weights_plus_kv_reads():
    """llama-3.1-8b (P = 8.03e9, 32 layers, 8 KV heads x 128, hidden 4096, bf16) on one A100
    (312 TFLOPS bf16, 2039 GB/s); 8 requests decoding at context 1000 each.

    kv bytes/token = 2 * 32 * 8 * 128 * 2 = 131,072
    flops  = 2 * 8.03e9 * 8 + 4 * 32 * 4096 * 8000 = 1.2848e11 + 4.194304e9 = 1.32674304e11
    compute = 1.32674304e11 / (312e12 * 0.5) s = 0.850476... ms
    bytes  = 8.03e9 * 2 + 131072 * 8000 = 1.606e10 + 1.048576e9 = 1.7108576e10
    memory = 1.7108576e10 / (2039e9 * 0.8) s = 10.488337... ms  (> compute: memory-bound)
    total  = 10.488337... + 0 (tp 1) + 1 = 11.488337... ms
    """
    m = RooflineLatency(model="llama-3.1-8b", gpu="A100")
    b = m.breakdown(Iteration.with_decodes(decode_contexts=(1000,) * 8))
    compute = 1.32674304e11 / (312e12 * 0.5) * 1e3
    memory = 1.7108576e10 / (2039e9 * 0.8) * 1e3
    assert b["compute_ms"] == approx(compute)
    assert b["memory_ms"] == approx(memory)
    assert b["comm_ms"] == 0.0 and b["bound"] == "memory"
    assert m.iteration_ms(Iteration.with_decodes(decode_contexts=(1000,) * 8)) == approx(
        memory + 1.0
    )
    assert memory + 1.0 == pytest.approx(11.48833742, rel=1e-9)


def test_a_short_chunk_after_a_long_cached_context_pays_for_reading_that_context():
    """qwen2.5-1.5b (P = 1.54e9, 28 layers, 2 KV heads x 128, hidden 1536, bf16) on one A40
    (149.7 TFLOPS bf16, 696 GB/s): 16 new prompt tokens after 100,000 cached ones.

    kv bytes/token = 2 * 28 * 2 * 128 * 2 = 28,672
    flops  = 2 * 1.54e9 * 16 + 4 * 28 * 1536 * 16 * (100000 + 16/2)
           = 4.928e10 + 172032 * 1600128 = 3.24553220096e11
    compute = 3.24553220096e11 / (149.7e12 * 0.5) s = 4.336048... ms
    bytes  = 1.54e9 * 2 + 28672 * (100000 + 16) = 3.08e9 + 2.867658752e9 = 5.947658752e9
    memory = 5.947658752e9 / (696e9 * 0.8) s = 10.681858... ms  (memory-bound)
    total  = 11.681858... ms. Without the cached context's KV read the bytes would be
    3.08e9 + 28672 * 16 and the step would take max(4.336, 5.532) + 1 = 6.532 ms.
    """
    m = RooflineLatency(model="qwen2.5-1.5b", gpu="A40")
    it = Iteration.lone_prefill(16, 100_000)
    b = m.breakdown(it)
    compute = 3.24553220096e11 / (149.7e12 * 0.5) * 1e3
    memory = 5.947658752e9 / (696e9 * 0.8) * 1e3
    assert b["compute_ms"] == approx(compute)
    assert b["memory_ms"] == approx(memory)
    assert b["bound"] == "memory"
    assert m.ttft_ms(16, 100_000) == approx(memory + 1.0)
    assert m.iteration_ms(it) == pytest.approx(11.6818584, rel=1e-8)


def test_a_mixed_tensor_parallel_step_adds_the_all_reduces():
    """llama-3.1-8b on 2 x H100 (989.5 TFLOPS bf16, 3350 GB/s, NVLink 900 GB/s bidirectional):
    one 2048-token prefill chunk (no context) plus 16 decodes at context 4096. tokens = 2064.

    flops  = 2 * 8.03e9 * 2064 + 4 * 32 * 4096 * (2048 * (0 + 1024) + 16 * 4096)
           = 3.314784e13 + 524288 * 2162688 = 3.4281711366144e13
    compute = 3.4281711366144e13 / (2 * 989.5e12 * 0.5) s = 34.645489... ms
    bytes  = 8.03e9 * 2 + 131072 * (2048 + 16 * 4096) = 1.606e10 + 8.858370048e9
           = 2.4918370048e10
    memory = 2.4918370048e10 / (2 * 3350e9 * 0.8) s = 4.648950... ms  (compute-bound)
    comm   = 2 * 32 * (0.01 + 2 * (2 - 1)/2 * 2064 * 4096 * 2 B / 450e9 B/s * 1e3)
           = 64 * (0.01 + 0.037573...) = 3.044734... ms
    total  = 34.645489 + 3.044734 + 1 = 38.690223... ms
    """
    m = RooflineLatency(model="llama-3.1-8b", gpu="H100", tp=2)
    it = Iteration.with_decodes(prefill=(PrefillChunk(2048, 0),), decode_contexts=(4096,) * 16)
    b = m.breakdown(it)
    compute = 3.4281711366144e13 / (2 * 989.5e12 * 0.5) * 1e3
    memory = 2.4918370048e10 / (2 * 3350e9 * 0.8) * 1e3
    comm = 2 * 32 * (0.01 + 2 * (2 - 1) / 2 * 2064 * 4096 * 2 / 450e9 * 1e3)
    assert b["compute_ms"] == approx(compute)
    assert b["memory_ms"] == approx(memory)
    assert b["comm_ms"] == approx(comm)
    assert b["bound"] == "compute"
    assert m.iteration_ms(it) == approx(compute + comm + 1.0)
    assert m.iteration_ms(it) == pytest.approx(38.6902233, rel=1e-8)


def test_a_tp4_fp8_decode_uses_the_fp8_peak_and_splits_the_weights():
    """llama-3.3-70b-fp8 (P = 70.6e9, 80 layers, 8 KV heads x 128, hidden 8192, 1-byte weights
    and KV) on 4 x H100 (fp8 peak 1979 TFLOPS): 32 decodes at context 2048. tokens = 32.

    kv bytes/token = 2 * 80 * 8 * 128 * 1 = 163,840
    flops  = 2 * 70.6e9 * 32 + 4 * 80 * 8192 * 32 * 2048 = 4.518400e12 + 1.7179869184e11
           = 4.69019869184e12
    compute = 4.69019869184e12 / (4 * 1979e12 * 0.5) s = 1.184992... ms
    bytes  = 70.6e9 * 1 + 163840 * 65536 = 7.06e10 + 1.073741824e10 = 8.133741824e10
    memory = 8.133741824e10 / (4 * 3350e9 * 0.8) s = 7.587446... ms  (memory-bound)
    comm   = 2 * 80 * (0.01 + 2 * 3/4 * 32 * 8192 * 2 / 450e9 * 1e3) = 1.879620... ms
    total  = 7.587446 + 1.879620 + 1 = 10.467066... ms
    """
    m = RooflineLatency(model="llama-3.3-70b-fp8", gpu="H100", tp=4)
    it = Iteration.with_decodes(decode_contexts=(2048,) * 32)
    b = m.breakdown(it)
    compute = 4.69019869184e12 / (4 * 1979e12 * 0.5) * 1e3
    memory = 8.133741824e10 / (4 * 3350e9 * 0.8) * 1e3
    comm = 2 * 80 * (0.01 + 2 * 3 / 4 * 32 * 8192 * 2 / 450e9 * 1e3)
    assert (b["compute_ms"], b["memory_ms"], b["comm_ms"]) == (
        approx(compute),
        approx(memory),
        approx(comm),
    )
    assert m.iteration_ms(it) == approx(memory + comm + 1.0)
    assert m.iteration_ms(it) == pytest.approx(10.4670660, rel=1e-8)
