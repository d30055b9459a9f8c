"""The simulated deployment's knobs: below the engine and the results that both use them."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SimConfig:
    """One simulated deployment; capacities and batch limits are per replica."""

    policy: str = "lru"
    policy_params: dict[str, Any] = field(default_factory=dict)
    capacity_blocks: int = 4096
    block_size: int | None = None
    mode: str = "prefix"
    salt_by_tenant: bool = False
    replicas: int = 1
    router: str = "round_robin"
    router_params: dict[str, Any] = field(default_factory=dict)
    max_batch_tokens: int = 8192
    max_running: int = 256
    include_output_blocks: bool = True
    sample_every_s: float = 1.0
    policy_metrics_every: int = 100
    #: what a cache-aware router reads as a replica's cache (:mod:`skv.sim.routers`): "exact"
    #: (the replica's own cache, an idealised router) or "approximate" (the router's own LRU of
    #: the prompts it routed there, as the router service keeps); ``precise`` is always exact
    router_view: str = "exact"
    #: the approximate view's cache per replica, in blocks (None: ``capacity_blocks``)
    router_cache_blocks: int | None = None
    #: lower KV tiers under each replica's GPU cache (``capacity_blocks``), top down, as
    #: ``NAME=SIZE[@POLICY][,link=LINK]`` (:class:`skv.tiers.TierSpec`; docs/tiers.md)
    tiers: list[str] = field(default_factory=list)
    tier_write: str = "through"
    tier_load: str = "copy"
    #: loads overlap the iteration's compute (layer-by-layer loading): it takes the longer of
    #: the two; otherwise (synchronous loads) the sum
    tier_overlap: bool = False
    #: "cheaper": load a lower-tier run only if cheaper than recomputing it; "load": always
    tier_choice: str = "cheaper"
    #: the model preset whose KV bytes per token size byte capacities and transfers (None: the
    #: latency model's, when it has one)
    tier_model: str | None = None

    def __post_init__(self) -> None:
        from skv.sim.routers import check_view

        check_view(self.router_view)
        # whole numbers (numpy's too), not bools: the simulator keeps them in C integers,
        # where 8.5 would silently become 8
        for name in ("replicas", "max_batch_tokens", "max_running"):
            value = getattr(self, name)
            try:
                if isinstance(value, bool):
                    raise TypeError
                setattr(self, name, operator.index(value))
            except TypeError:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}") from None
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        period = self.sample_every_s
        if isinstance(period, bool) or not isinstance(period, int | float) or not period >= 0:
            raise ValueError(f"sample_every_s must be >= 0 seconds, got {period!r}")  # NaN too
        if self.tiers:
            from skv.tiers import CHOICES, LOADS, WRITES, TierSpec, check_move_policies

            specs = [TierSpec.parse(spec) for spec in self.tiers]
            for name, value, allowed in (
                ("tier_write", self.tier_write, WRITES),
                ("tier_load", self.tier_load, LOADS),
                ("tier_choice", self.tier_choice, CHOICES),
            ):
                if value not in allowed:
                    raise ValueError(f"{name} {value!r}: one of {', '.join(allowed)}")
            if not isinstance(self.tier_overlap, bool):
                raise ValueError(f"tier_overlap must be true or false, got {self.tier_overlap!r}")
            if self.tier_load == "move":
                check_move_policies([s.policy for s in specs])
        if self.router_cache_blocks is not None and self.router_cache_blocks < 1:
            raise ValueError(
                f"router_cache_blocks must be >= 1 or None, got {self.router_cache_blocks}"
            )
