"""Eviction policies: one file each, one registry (``skv.policies.registry``)."""
