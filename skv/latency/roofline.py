"""Roofline latency: an iteration takes as long as its FLOPs or its bytes, whichever is slower.

Why a roofline: decode batches are memory-bound (every step streams all weights for a handful of
tokens) and prefill is compute-bound (thousands of tokens share one pass over the weights), so one
linear model cannot price both. The roofline gets both regimes, and the cost of attending to
cached context, from the model's architecture and a GPU datasheet, with two derating factors.

For an iteration with prefill chunks (t_i tokens after c_i tokens already in KV) and decode
requests with contexts L_j, on ``tp`` GPUs (tensor parallel)::

    flops   = 2 * P * (sum t_i + n_decode)                          # dense matmuls
            + 4 * layers * hidden * sum t_i * (c_i + t_i / 2)        # causal attention, prefill
            + 4 * layers * hidden * sum L_j                          # attention, decode
    bytes   = P * weight_bytes                                       # weights, read once
            + kv_bytes_per_token * (sum (c_i + t_i) + sum L_j)       # KV read (and written)
    compute_ms = flops / (tp * peak_flops * mfu)
    memory_ms  = bytes / (tp * hbm_bandwidth * mbu)
    comm_ms    = 2 * layers * (allreduce_latency_ms
                               + 2 * (tp - 1) / tp * tokens * hidden * 2 B / link_bw)  if tp > 1
    iteration_ms = max(compute_ms, memory_ms) + comm_ms + overhead_ms

P = parameters; ``4 * layers * hidden`` per (query, key) pair is QK^T plus AV at 2 FLOPs per
multiply-add (``hidden`` = query heads * head_dim, so GQA does not shrink it). The comm term is a
ring all-reduce of the bf16 activations after attention and after the MLP of every layer
(Megatron-style TP), not overlapped with compute; link_bw is one direction of the datasheet's
bidirectional interconnect. Peak flops are fp8 for 1-byte weights on GPUs that have fp8 units,
bf16 otherwise (``GpuPreset.peak_tflops``).

Ignored, on purpose: activation traffic, embedding lookups counted as matmul FLOPs (P includes
them), kernel launch gaps beyond ``overhead_ms``, and compute/memory overlap inefficiency beyond
the derating factors. Constants and their sources:

- ``mfu = 0.5``: achieved fraction of peak tensor FLOPs in large prefills; 40-60% is typical
  for vLLM/SGLang prefill on A100/H100 (an assumption; calibrate against a measured TTFT).
- ``mbu = 0.8``: achieved fraction of HBM bandwidth in decode; memory-bound decode kernels
  reach 70-85% of peak (an assumption, same caveat).
- ``overhead_ms = 1.0``: scheduler, sampling and launch cost per step in a CUDA-graph engine
  (an assumption; the order of magnitude of vLLM v1's CPU-side step time).
- ``allreduce_latency_ms = 0.01``: fixed cost of one small all-reduce over NVLink (~10 us for
  NCCL; an assumption).
- Default ``model="qwen2.5-1.5b"``, ``gpu="A40"``: SAECache's setup (REFERENCE.md section 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from skv.latency.base import Iteration, LatencyModel
from skv.latency.gpus import GpuPreset, get_gpu
from skv.latency.roofline_kernel import RooflineKernel
from skv.sizing import ModelPreset, get_model

#: activations exchanged by tensor-parallel all-reduces are bf16
_ACTIVATION_BYTES = 2
#: all-reduces per layer under Megatron-style TP (after attention, after the MLP)
_ALLREDUCES_PER_LAYER = 2

FORMULA = (
    "iteration_ms = max(compute_ms, memory_ms) + comm_ms + overhead_ms; "
    "compute_ms = [2*P*(prefill_tokens + decode_seqs) "
    "+ 4*layers*hidden*sum_chunks(tokens*(context_before + tokens/2)) "
    "+ 4*layers*hidden*sum_decode(context)] / (tp * peak_flops * mfu); "
    "memory_ms = [P*weight_dtype_bytes + kv_bytes_per_token*(sum_chunks(context_before + tokens) "
    "+ sum_decode(context))] / (tp * hbm_bandwidth * mbu); "
    "comm_ms = 2*layers*(allreduce_latency_ms + 2*(tp-1)/tp * batch_tokens*hidden*2B "
    "/ (interconnect/2)) if tp > 1 else 0"
)


@dataclass(frozen=True)
class RooflineLatency(LatencyModel):
    """max(compute, memory) + tensor-parallel communication + fixed overhead; see module doc."""

    name: ClassVar[str] = "roofline"
    formula: ClassVar[str] = FORMULA

    model: str | ModelPreset = "qwen2.5-1.5b"
    gpu: str | GpuPreset = "A40"
    tp: int = 1
    mfu: float = 0.5
    mbu: float = 0.8
    overhead_ms: float = 1.0
    allreduce_latency_ms: float = 0.01

    # derived once, so iteration_ms is a handful of float operations
    _preset: ModelPreset = field(init=False, repr=False, compare=False)
    _gpu: GpuPreset = field(init=False, repr=False, compare=False)
    _flops_per_ms: float = field(init=False, repr=False, compare=False)
    _bytes_per_ms: float = field(init=False, repr=False, compare=False)
    _attn_flops_per_pair: float = field(init=False, repr=False, compare=False)
    _weight_bytes: float = field(init=False, repr=False, compare=False)
    _comm_fixed_ms: float = field(init=False, repr=False, compare=False)
    _comm_ms_per_token: float = field(init=False, repr=False, compare=False)
    _kernel: RooflineKernel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        preset = self.model if isinstance(self.model, ModelPreset) else get_model(self.model)
        gpu = get_gpu(self.gpu)
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"roofline latency: tp must be an integer >= 1, got {self.tp!r}")
        for key in ("mfu", "mbu"):
            value = getattr(self, key)
            if not 0 < value <= 1:
                raise ValueError(f"roofline latency: {key} must be in (0, 1], got {value}")
        for key in ("overhead_ms", "allreduce_latency_ms"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"roofline latency: {key} must be finite and >= 0, got {value}")
        weight_bytes = preset.num_params * preset.weight_dtype_bytes
        per_gpu_gb = weight_bytes / self.tp / 1e9
        if per_gpu_gb > gpu.memory_gb:
            raise ValueError(
                f"roofline latency: {preset.name} weights need {per_gpu_gb:.1f} GB per GPU at "
                f"tp={self.tp}, more than the {gpu.name}'s {gpu.memory_gb:g} GB; raise tp"
            )
        peak_flops = gpu.peak_tflops(preset.weight_dtype_bytes) * 1e12
        link_bytes_per_s = gpu.interconnect_gbs * 1e9 / 2  # one direction
        set_ = object.__setattr__
        set_(self, "_preset", preset)
        set_(self, "_gpu", gpu)
        set_(self, "_flops_per_ms", self.tp * peak_flops * self.mfu / 1e3)
        set_(self, "_bytes_per_ms", self.tp * gpu.hbm_gbs * 1e9 * self.mbu / 1e3)
        set_(self, "_attn_flops_per_pair", 4.0 * preset.num_layers * preset.hidden_size)
        set_(self, "_weight_bytes", float(weight_bytes))
        n_allreduce = _ALLREDUCES_PER_LAYER * preset.num_layers
        if self.tp > 1:
            ring = 2 * (self.tp - 1) / self.tp
            per_token = ring * preset.hidden_size * _ACTIVATION_BYTES / link_bytes_per_s * 1e3
            set_(self, "_comm_fixed_ms", n_allreduce * self.allreduce_latency_ms)
            set_(self, "_comm_ms_per_token", n_allreduce * per_token)
        else:
            set_(self, "_comm_fixed_ms", 0.0)
            set_(self, "_comm_ms_per_token", 0.0)
        kernel = RooflineKernel(
            2.0 * preset.num_params,
            self._attn_flops_per_pair,
            self._weight_bytes,
            preset.kv_bytes_per_token,
            self._flops_per_ms,
            self._bytes_per_ms,
            self._comm_fixed_ms,
            self._comm_ms_per_token,
            self.overhead_ms,
        )
        set_(self, "_kernel", kernel)

    def _terms(self, it: Iteration) -> tuple[float, float, float]:
        """(compute_ms, memory_ms, comm_ms) of ``it``."""
        return self._kernel.terms(it)

    def decode_ms(self, seqs: int, context_tokens: int) -> float:
        """``iteration_ms`` of a decode-only iteration, term for term as :meth:`_terms`."""
        return self._kernel.decode_ms(seqs, context_tokens)

    def prefill_ms(
        self, tokens: list, contexts: list, decode_seqs: int, decode_context_tokens: int
    ) -> float:
        """:meth:`iteration_ms` of those prefill chunks and decodes, without building the
        ``Iteration`` (the kernel sums the same numbers in the same order)."""
        return self._kernel.prefill_ms(tokens, contexts, decode_seqs, decode_context_tokens)

    def decode_run_ends(self, seqs: int, context_tokens: int, count: int, start_s: float) -> list:
        """:meth:`decode_ms` step by step in one compiled loop (same operations, same order,
        so the same floats): the simulator's hottest loop in decode-heavy runs."""
        return self._kernel.decode_run_ends(seqs, context_tokens, count, start_s)

    def breakdown(self, it: Iteration) -> dict[str, float | str]:
        """The terms of ``iteration_ms`` and which roof binds (``bound``: compute or memory)."""
        compute_ms, memory_ms, comm_ms = self._terms(it)
        return {
            "compute_ms": compute_ms,
            "memory_ms": memory_ms,
            "comm_ms": comm_ms,
            "overhead_ms": self.overhead_ms,
            "total_ms": max(compute_ms, memory_ms) + comm_ms + self.overhead_ms,
            "bound": "compute" if compute_ms >= memory_ms else "memory",
        }

    def iteration_ms(self, it: Iteration) -> float:
        return self._kernel.iteration_ms(it)

    def describe(self) -> dict[str, Any]:
        p, g = self._preset, self._gpu
        return {
            "model": self.name,
            "formula": self.formula,
            "constants": {
                "llm": p.name,
                "num_params": p.num_params,
                "num_layers": p.num_layers,
                "hidden_size": p.hidden_size,
                "weight_dtype_bytes": p.weight_dtype_bytes,
                "kv_bytes_per_token": p.kv_bytes_per_token,
                "gpu": g.name,
                "peak_tflops": g.peak_tflops(p.weight_dtype_bytes),
                "hbm_gbs": g.hbm_gbs,
                "interconnect_gbs": g.interconnect_gbs,
                "tp": self.tp,
                "mfu": self.mfu,
                "mbu": self.mbu,
                "overhead_ms": self.overhead_ms,
                "allreduce_latency_ms": self.allreduce_latency_ms,
            },
            "source": f"{g.source}; model preset skv.sizing.{p.name}",
        }
