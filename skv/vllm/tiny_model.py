"""Build a tiny random-weight Llama, a byte-level BPE tokenizer and a chat template into DIR.

No model hub is reachable on the machines this project runs on, so the engine tests serve a model
built here in seconds: 2 layers, hidden 256, 4 attention heads, 2 KV heads, head_dim 64,
vocabulary 512. Its outputs are noise, but every token costs the engine real prefill and decode
work and every block goes through vLLM's prefix cache, which is what skv measures.

``--shape small`` builds a larger one (4 layers, hidden 512, 8 heads, 4 KV heads, intermediate
1408; 12.3M parameters) for timing studies: its steps are mostly model compute, where the tiny
model's decode steps are mostly vLLM's own scheduling and output handling.

Runs inside the ENGINE venv (it needs torch, transformers and tokenizers, which the project venv
lacks); ``skv vllm tiny-model DIR`` runs it there::

    .venv-vllm/bin/python skv/vllm/tiny_model.py DIR [--seed 0] [--max-position 4096]

This file imports nothing from skv, so it runs by path from any interpreter that has those three.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
BOS, EOS, UNK = "<s>", "</s>", "<unk>"

# Each message: role marker, newline, content, end-of-sequence; then the assistant marker when a
# reply is wanted. Jinja, as transformers and vLLM render it.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A key-value cache stores attention keys and values for every token of a prompt.",
    "Prefix caching lets a serving engine reuse the blocks of a prompt it has already seen.",
    "def main(argv):\n    return run(parse_args(argv))\n",
    "You are a helpful assistant. Answer the question below in one sentence.",
    "System prompts, tool definitions and documents repeat across many requests.",
    "Eviction policies decide which blocks leave the cache when memory runs out.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" # @ % & | ~ ^ _ \\",
    "import numpy as np\nimport torch\nfrom pathlib import Path\n",
    "Time to first token falls when the prefix of a prompt is already cached.",
]


def build_tokenizer(out: Path) -> None:
    """Train a byte-level BPE (every byte is in the alphabet, so any text encodes) and save it as
    a transformers fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=EOS,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Older transformers keep the template only in tokenizer_config.json, newer ones also write
    # chat_template.jinja; vLLM reads either.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


#: model shapes by name: layers, hidden size, MLP size, attention heads, KV heads (head_dim 64)
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2},
    "small": {"layers": 4, "hidden": 512, "intermediate": 1408, "heads": 8, "kv_heads": 4},
}
HEAD_DIM = 64


def build_model(out: Path, seed: int, max_position: int, shape: str = "tiny") -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    assert len(tok) <= VOCAB_SIZE, len(tok)
    sh = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=sh["hidden"],
        intermediate_size=sh["intermediate"],
        num_hidden_layers=sh["layers"],
        num_attention_heads=sh["heads"],
        num_key_value_heads=sh["kv_heads"],
        head_dim=HEAD_DIM,
        max_position_embeddings=max_position,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def build(out: str | Path, seed: int = 0, max_position: int = 4096, shape: str = "tiny") -> dict:
    """Write config.json, model.safetensors, the tokenizer files and the chat template into
    ``out``; return a summary (also written to ``skv_tiny_model.json``)."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: expected one of {', '.join(SHAPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    info = build_model(out, seed, max_position, shape)
    sh = SHAPES[shape]
    info.update(
        {
            "shape": shape,
            **sh,
            "head_dim": HEAD_DIM,
            "seed": seed,
            "max_position_embeddings": max_position,
            # KV bytes per token in float32: 2 (K and V) * layers * kv_heads * head_dim * 4
            "kv_bytes_per_token": 2 * sh["layers"] * sh["kv_heads"] * HEAD_DIM * 4,
        }
    )
    (out / "skv_tiny_model.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="output directory (created)")
    ap.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    ap.add_argument("--max-position", type=int, default=4096, help="max_position_embeddings")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="model size")
    args = ap.parse_args(argv)
    info = build(args.dir, seed=args.seed, max_position=args.max_position, shape=args.shape)
    print(f"tiny model written to {args.dir}: {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
