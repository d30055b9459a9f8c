"""The vllm_eviction study: skv's eviction policies run inside a real vLLM engine by the skv
plugin, each compared request by request with skv's simulation of the same policy (``study``).
Config in ``experiments/vllm_eviction/``, notebook in ``notebooks/vllm_eviction/``.
"""
