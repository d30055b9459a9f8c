"""KV-cache sizing: model presets (bytes per token) and capacity specs.

KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes. A capacity can be
given as blocks (``4096`` or ``4096blocks``), tokens (``50000tok``), a fraction of the trace's
unique blocks (``10%``) or bytes (``30GB``, ``512MiB``; needs a model preset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """Architecture numbers that KV sizing (and later, roofline timing) need."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    num_params: float
    hidden_size: int
    weight_dtype_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes


MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("llama-3.1-8b", 32, 8, 128, 2, 8.03e9, 4096, 2),
        ModelPreset("llama-3.3-70b-fp8", 80, 8, 128, 1, 70.6e9, 8192, 1),
        ModelPreset("qwen2.5-1.5b", 28, 2, 128, 2, 1.54e9, 1536, 2),
        ModelPreset("qwen2.5-7b", 28, 4, 128, 2, 7.62e9, 3584, 2),
        # the tiny random-weight Llama the vLLM harness builds (float32 on CPU)
        ModelPreset("tiny-llama", 2, 2, 64, 4, 2.0e6, 256, 4),
    )
}


def get_model(name: str) -> ModelPreset:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(MODELS)}") from None


_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SPEC = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z%]*)\s*$")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A parsed capacity; resolve it to blocks once the trace and block size are known."""

    text: str
    kind: str  # blocks | tokens | fraction | bytes
    value: float

    @classmethod
    def parse(cls, text: str | int | float) -> Capacity:
        if isinstance(text, int | float):
            return cls(str(text), "blocks", float(text))
        m = _SPEC.match(text)
        if not m:
            raise ValueError(
                f"capacity {text!r}: expected e.g. 4096 (blocks), 50000tok, 10% or 30GB"
            )
        num, unit = float(m.group(1)), m.group(2).lower()
        if unit in ("", "blocks", "block", "blk"):
            return cls(text, "blocks", num)
        if unit in ("tok", "tokens", "token", "t"):
            return cls(text, "tokens", num)
        if unit == "%":
            if not 0 < num <= 100:
                raise ValueError(f"capacity {text!r}: a percentage must be in (0, 100]")
            return cls(text, "fraction", num / 100)
        if unit in _UNITS:
            return cls(text, "bytes", num * _UNITS[unit])
        raise ValueError(f"capacity {text!r}: unknown unit {unit!r}")

    def to_blocks(
        self, *, block_size: int, unique_blocks: int | None = None, model: str | None = None
    ) -> int:
        if self.kind == "blocks":
            n = int(self.value)
        elif self.kind == "tokens":
            n = int(self.value // block_size)
        elif self.kind == "fraction":
            if unique_blocks is None:
                raise ValueError(f"capacity {self.text!r} is relative: the trace is needed")
            n = round(self.value * unique_blocks)
        else:
            if model is None:
                raise ValueError(f"capacity {self.text!r} is in bytes: give a model (--model)")
            per_block = get_model(model).kv_bytes_per_token * block_size
            n = int(self.value // per_block)
        if n < 1:
            raise ValueError(f"capacity {self.text!r} resolves to {n} blocks; need at least 1")
        return n
