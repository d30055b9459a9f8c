"""The recompute cost of a KV block given its prefix: the FLOP model ``pgdsf`` and ``marconi``
share.

A block of ``t`` tokens preceded by ``c`` tokens costs, to prefill again, what skv's roofline
(:mod:`skv.latency.roofline`) charges it in the compute-bound regime:
``2 P t`` dense FLOPs plus ``4 L h t (c + t/2)`` causal-attention FLOPs (every one of its
tokens attends to the ``c`` tokens before the block and, on average, to half of the block).
Divided by ``2 P`` (the FLOPs of one token without context) that is, in *tokens*::

    cost = t * (1 + (c + t/2) / X),        X = 2 P / (4 L h) = P / (2 L h)

``X`` (``attn_crossover``) is the context length at which a token's attention FLOPs equal its
dense FLOPs. Default: the ``llama-3.1-8b`` preset of :mod:`skv.sizing` (P = 8.03e9 parameters,
L = 32 layers, h = 4096): ``X = 8.03e9 / (2 * 32 * 4096) = 30632`` tokens. For comparison, the
textbook count of a dense layer (``24 d^2`` FLOPs per token: ``4 d^2`` attention projections and
an ``8 d^2`` MLP, at 2 FLOPs per weight) against ``4 d c`` for attention gives ``X = 6 d = 24576``;
Llama-3-8B's actual layer (grouped-query K/V, 14336-wide gated MLP: 218.1M weights per layer)
gives ``X = 2 * 218.1e6 / (4 * 4096) = 26624`` without the embedding matrices; the roofline counts
``P`` whole (embeddings included), hence 30632, which keeps ``cost`` proportional to the
roofline's prefill time of the block.

``c`` is ``pos * block_size`` (``pos``: the block's index in the request that inserted it): exact
in prefix keying, where every block before the last is full; in segment keying, where a
segment's last block can be partial, it overstates ``c`` by under one block per earlier segment.
A block whose request carries no ``block_size`` (none in skv's caches) counts blocks of
``DEFAULT_BLOCK_SIZE`` tokens.
"""

from __future__ import annotations

import cython

from skv.blocks import DEFAULT_BLOCK_SIZE, RequestBlocks
from skv.cache.block import Block
from skv.sizing import ModelPreset, get_model

#: the preset the default crossover comes from
DEFAULT_MODEL = "llama-3.1-8b"


def attn_crossover(model: ModelPreset) -> float:
    """Context length (tokens) at which a token's attention FLOPs (``4 L h c``) equal its dense
    FLOPs (``2 P``), in skv's roofline model."""
    return model.num_params / (2.0 * model.num_layers * model.hidden_size)


#: ``attn_crossover(llama-3.1-8b)`` = 30632.02 tokens
DEFAULT_ATTN_CROSSOVER: float = attn_crossover(get_model(DEFAULT_MODEL))


_DEFAULT_BS = cython.declare(cython.longlong, DEFAULT_BLOCK_SIZE)


def recompute_cost(
    tokens: cython.double, context: cython.double, crossover: cython.double
) -> cython.double:
    """Prefill cost of ``tokens`` tokens after ``context`` cached ones, in context-free tokens."""
    return tokens * (1.0 + (context + 0.5 * tokens) / crossover)


def block_cost(b: Block, crossover: cython.double) -> cython.double:
    """``recompute_cost`` of block ``b`` with ``pos * block_size`` tokens before it."""
    req = b.req
    if type(req) is RequestBlocks:  # every cache's requests: the C field, no attribute lookup
        rb: RequestBlocks = req
        bs: cython.longlong = rb.block_size or _DEFAULT_BS
        return recompute_cost(b.tokens, b.pos * bs, crossover)
    return recompute_cost(
        b.tokens, b.pos * (getattr(req, "block_size", None) or DEFAULT_BLOCK_SIZE), crossover
    )


@cython.annotation_typing(False)  # Python's conversion: a YAML string such as "4e4" too
def check_crossover(policy: str, crossover: float) -> float:
    """``crossover`` as a float, refused unless it is a positive finite number."""
    x = float(crossover)
    if not 0.0 < x < float("inf"):
        raise ValueError(f"{policy}: attn_crossover must be > 0 tokens, got {crossover!r}")
    return x
