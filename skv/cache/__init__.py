"""Block caches: the radix block cache for all policies and vLLM's exact block pool."""
