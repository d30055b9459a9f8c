"""GPU presets for the roofline latency model: peak dense tensor throughput and memory.

All throughput numbers are *dense* (no 2:4 structured sparsity): NVIDIA datasheets print the
sparsity figure with an asterisk, and the dense number is half of it. Interconnect figures are the
datasheets' bidirectional totals per GPU; the roofline model halves them for one direction.

================  ==========  ==========  =========  =======  ====================  ============
preset            bf16 TFLOPS fp8 TFLOPS  HBM GB/s   mem GB   interconnect GB/s     source
================  ==========  ==========  =========  =======  ====================  ============
A40               149.7       --          696        48       112.5 (NVLink bridge)  [1]
L40S              362.05      733         864        48       64 (PCIe Gen4 x16)     [2]
A100 (80GB SXM)   312         --          2039       80       600 (NVLink 3)         [3]
H100 (SXM)        989.5       1979        3350       80       900 (NVLink 4)         [4]
H200 (SXM)        989.5       1979        4800       141      900 (NVLink 4)         [5]
================  ==========  ==========  =========  =======  ====================  ============

[1] NVIDIA A40 datasheet: BF16/FP16 Tensor Core 149.7 | 299.4* TFLOPS, 48 GB GDDR6, 696 GB/s,
    NVLink 112.5 GB/s bidirectional (pairs of GPUs only; more GPUs talk over PCIe Gen4, 64 GB/s).
[2] NVIDIA L40S datasheet: BF16 362.05 | 733*, FP8 733 | 1,466*, 48 GB GDDR6, 864 GB/s, PCIe
    Gen4 x16 64 GB/s, no NVLink.
[3] NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: BF16 312 | 624*, 80 GB HBM2e,
    2,039 GB/s, NVLink 600 GB/s. Ampere has no FP8 tensor cores (fp8 weights run as W8A16).
[4] NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 1,979*, FP8 3,958* (both with
    sparsity; dense = half), 80 GB, 3.35 TB/s, NVLink 900 GB/s.
[5] NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: same compute as H100 SXM, 141 GB
    HBM3e, 4.8 TB/s, NVLink 900 GB/s.

(*) = with sparsity. The papers' setups (REFERENCE.md section 3): SAECache ran one A40,
CacheRoute ran H100s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuPreset:
    """Peak numbers of one GPU; the roofline model derates them with MFU/MBU."""

    name: str
    bf16_tflops: float  # dense bf16/fp16 tensor-core peak
    fp8_tflops: float | None  # dense fp8 tensor-core peak; None where the GPU has no fp8 units
    hbm_gbs: float  # memory bandwidth, GB/s (10^9 bytes/s)
    memory_gb: float
    interconnect_gbs: float  # GPU-to-GPU bandwidth, bidirectional total per GPU, GB/s
    source: str

    def peak_tflops(self, weight_dtype_bytes: int) -> float:
        """Peak for a model's weights: fp8 tensor cores for 1-byte weights where they exist.

        Without fp8 units (A40, A100) fp8 weights are dequantised and multiplied in bf16
        (vLLM's W8A16 Marlin path), so the bf16 peak applies; wider weights also use bf16.
        """
        if weight_dtype_bytes == 1 and self.fp8_tflops is not None:
            return self.fp8_tflops
        return self.bf16_tflops


GPUS: dict[str, GpuPreset] = {
    g.name.lower(): g
    for g in (
        GpuPreset("A40", 149.7, None, 696.0, 48.0, 112.5, "NVIDIA A40 datasheet"),
        GpuPreset("L40S", 362.05, 733.0, 864.0, 48.0, 64.0, "NVIDIA L40S datasheet"),
        GpuPreset("A100", 312.0, None, 2039.0, 80.0, 600.0, "NVIDIA A100 datasheet, 80GB SXM"),
        GpuPreset("H100", 989.5, 1979.0, 3350.0, 80.0, 900.0, "NVIDIA H100 datasheet, SXM"),
        GpuPreset("H200", 989.5, 1979.0, 4800.0, 141.0, 900.0, "NVIDIA H200 datasheet, SXM"),
    )
}

#: other spellings people write in configs
_ALIASES = {
    "a100-80gb": "a100",
    "a100-sxm": "a100",
    "a100-80gb-sxm": "a100",
    "h100-sxm": "h100",
    "h100-80gb": "h100",
    "h200-sxm": "h200",
}


def get_gpu(name: str | GpuPreset) -> GpuPreset:
    """Look a preset up by name (case-insensitive); a ``GpuPreset`` passes through."""
    if isinstance(name, GpuPreset):
        return name
    key = name.lower()
    key = _ALIASES.get(key, key)
    try:
        return GPUS[key]
    except KeyError:
        known = ", ".join(g.name for g in GPUS.values())
        raise ValueError(f"unknown GPU preset {name!r}; known: {known}") from None
