"""The fidelity study: one seeded trace sent to a real vLLM CPU engine and replayed through the
simulator's exact vLLM pool, compared request by request (``study``). Config in
``experiments/fidelity/``, notebook in ``notebooks/fidelity/``.
"""
