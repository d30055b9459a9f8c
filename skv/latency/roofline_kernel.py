"""The roofline's per-iteration arithmetic, compiled (skv/_build.py; plain Python without a
compiler): the simulator prices every iteration with it, so it is the cluster runs' inner loop.

:class:`skv.latency.roofline.RooflineLatency` validates its inputs, derives the constants and
delegates here. Every formula is the one in that module's docstring, evaluated in the same
operation order whether compiled or not (so the floats are identical; setup.py turns off
fused multiply-add contraction). ``kv`` (bytes per KV token) may be fractional (a 4-bit KV
cache); its products with token counts equal Python's exact int products below 2**53 bytes.
"""

from __future__ import annotations

from typing import Any

import cython


class RooflineKernel:
    """The derived constants of one roofline model: ``two_p`` = 2 x parameters (FLOPs per
    token through the dense layers), ``attn`` FLOPs per attended (query, key) pair, ``weights``
    bytes read per iteration, ``kv`` bytes per KV token, ``fpm``/``bpm`` FLOPs/bytes per ms
    after derating, ``comm_fixed``/``comm_per_token`` the all-reduce cost (ms), ``overhead``
    the fixed ms per iteration."""

    def __init__(
        self,
        two_p: float,
        attn: float,
        weights: float,
        kv: float,
        fpm: float,
        bpm: float,
        comm_fixed: float,
        comm_per_token: float,
        overhead: float,
    ) -> None:
        self.two_p = two_p
        self.attn = attn
        self.weights = weights
        self.kv = kv
        self.fpm = fpm
        self.bpm = bpm
        self.comm_fixed = comm_fixed
        self.comm_per_token = comm_per_token
        self.overhead = overhead

    def terms(self, it: Any) -> tuple[float, float, float]:
        """(compute_ms, memory_ms, comm_ms) of an ``Iteration``."""
        pairs: cython.double = 0.0  # (query, key) pairs attended by prefill chunks, causal
        kv_read: cython.longlong = 0
        prefill: cython.longlong = 0
        tok: cython.longlong
        ctx: cython.longlong
        for c in it.prefill:
            tok = c.tokens
            ctx = c.context_before
            pairs += tok * (ctx + tok / 2.0)
            kv_read += ctx + tok
            prefill += tok
        return self.sum_terms(pairs, kv_read, prefill, it.decode_seqs, it.decode_context_tokens)

    def sum_terms(
        self,
        pairs: cython.double,
        kv_read: cython.longlong,
        prefill: cython.longlong,
        decode_seqs: cython.longlong,
        decode_ctx: cython.longlong,
    ) -> tuple[float, float, float]:
        """:meth:`terms` from the prefill chunks' sums (attended pairs, KV tokens read, tokens
        computed) and the decodes."""
        tokens: cython.longlong = prefill + decode_seqs
        flops: cython.double = self.two_p * tokens + self.attn * (pairs + decode_ctx)
        nbytes: cython.double = self.weights + self.kv * (kv_read + decode_ctx)
        comm_ms: cython.double = self.comm_fixed + self.comm_per_token * tokens if tokens else 0.0
        return flops / self.fpm, nbytes / self.bpm, comm_ms

    def iteration_ms(self, it: Any) -> float:
        compute_ms, memory_ms, comm_ms = self.terms(it)
        return max(compute_ms, memory_ms) + comm_ms + self.overhead

    def prefill_ms(
        self,
        tokens: list,
        contexts: list,
        decode_seqs: cython.longlong,
        decode_context_tokens: cython.longlong,
    ) -> float:
        """:meth:`iteration_ms` of the iteration with prefill chunks ``(tokens[i],
        contexts[i])`` (tokens, context_before) and these decodes, without building it:
        :meth:`terms`' sums over the same numbers in the same order, then the same formulas."""
        if len(contexts) != len(tokens):
            raise ValueError(f"prefill_ms: {len(tokens)} chunk sizes, {len(contexts)} contexts")
        pairs: cython.double = 0.0
        kv_read: cython.longlong = 0
        prefill: cython.longlong = 0
        tok: cython.longlong
        ctx: cython.longlong
        i: cython.Py_ssize_t
        for i in range(len(tokens)):
            tok = tokens[i]
            ctx = contexts[i]
            pairs += tok * (ctx + tok / 2.0)
            kv_read += ctx + tok
            prefill += tok
        compute_ms, memory_ms, comm_ms = self.sum_terms(
            pairs, kv_read, prefill, decode_seqs, decode_context_tokens
        )
        return max(compute_ms, memory_ms) + comm_ms + self.overhead

    def decode_ms(self, seqs: cython.longlong, context_tokens: cython.longlong) -> float:
        """``iteration_ms`` of a decode-only iteration, term for term as :meth:`terms`."""
        flops: cython.double = self.two_p * seqs + self.attn * context_tokens
        nbytes: cython.double = self.weights + self.kv * context_tokens
        comm_ms: cython.double = self.comm_fixed + self.comm_per_token * seqs if seqs else 0.0
        compute_ms: cython.double = flops / self.fpm
        memory_ms: cython.double = nbytes / self.bpm
        return (compute_ms if compute_ms >= memory_ms else memory_ms) + comm_ms + self.overhead

    def decode_run_ends(
        self,
        seqs: cython.longlong,
        context_tokens: cython.longlong,
        count: cython.Py_ssize_t,
        start_s: cython.double,
    ) -> list:
        """End times of ``count`` decode-only iterations from ``start_s``, the context growing
        by ``seqs`` per iteration: :meth:`decode_ms` step by step."""
        two_p_d: cython.double = self.two_p * seqs
        attn: cython.double = self.attn
        weights: cython.double = self.weights
        kv: cython.double = self.kv
        fpm: cython.double = self.fpm
        bpm: cython.double = self.bpm
        over: cython.double = self.overhead
        comm_ms: cython.double = self.comm_fixed + self.comm_per_token * seqs if seqs else 0.0
        compute_ms: cython.double
        memory_ms: cython.double
        step_ms: cython.double
        t: cython.double = start_s
        ctx: cython.longlong = context_tokens
        _i: cython.Py_ssize_t
        ends: list = []
        for _i in range(count):
            compute_ms = (two_p_d + attn * ctx) / fpm
            memory_ms = (weights + kv * ctx) / bpm
            step_ms = (compute_ms if compute_ms >= memory_ms else memory_ms) + comm_ms + over
            t = t + step_ms / 1000.0
            ends.append(t)
            ctx += seqs
        return ends
