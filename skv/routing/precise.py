"""``precise``: the replica whose engine reports the longest cached prefix (llm-d's precise
prefix scorer)."""

from __future__ import annotations

from skv.routing.prefix_locality import PrefixLocality


class Precise(PrefixLocality):
    """Ranks like ``prefix_locality``; the difference is the view it is given. The router
    service passes views whose ``match`` is the leading full engine blocks of the prompt's real
    token ids that the replica's engine reported through KV-cache events
    (``skv.vllm.kv_events.KVIndex.token_overlaps``; llm-d's score ``matched / total`` orders
    replicas the same way). In the simulator the view is the exact cache, so ``precise`` ranks
    exactly as ``prefix_locality`` there."""

    name = "precise"
