"""Experiment configs: pydantic models plus YAML loading with errors that name file and field.

An experiment is one workload (name + parameters) run under every listed seed, every listed
per-replica cache capacity and every listed eviction policy, through the serving simulator with
one latency model. Unknown keys are rejected everywhere (typos must not silently fall back to a
default). Example (``experiments/semantickv/smoke.yaml``)::

    id: smoke
    title: Smoke test            # optional: figures show it instead of the id
    description: tiny end-to-end check
    workload:
      name: shared_system_prompt
      params: {num_requests: 100, rate_rps: 5.0}
    policies: [lru, {name: adaptive_semantic, params: {half_life_s: 5.0}}]
    capacities: ["10%"]
    latency: {name: linear, params: {base_ttft_ms: 20.0}}
    seeds: [0, 1]
    replicas: {count: 1, router: round_robin}
    block_size: 16
    keying: prefix
    batch: {max_batch_tokens: 8192, max_running: 256}

A capacity is a :class:`skv.sizing.Capacity` spec per replica: blocks (``4096``), tokens
(``50000tok``), bytes (``30GB``; needs ``model``) or a share of the workload's unique prompt
blocks (``10%``; resolved per seed, since each seed draws a different trace).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from skv.sizing import Capacity

#: the metrics a seed claim or a summary may rank policies by, and which direction is better
METRICS: dict[str, str] = {
    "ttft_ms_mean": "lower",
    "ttft_ms_p50": "lower",
    "ttft_ms_p90": "lower",
    "ttft_ms_p99": "lower",
    "e2e_ms_mean": "lower",
    "queue_ms_mean": "lower",
    "token_hit_rate": "higher",
    "block_hit_rate": "higher",
    "cached_tokens": "higher",
}


def humanise_id(ident: str) -> str:
    """A readable stand-in for a title nobody wrote: ``low_memory_rag_stress`` -> ``Low memory
    rag stress`` (figures must not show raw ids)."""
    text = re.sub(r"[_-]+", " ", ident).strip()
    return text[:1].upper() + text[1:]


def experiment_title(doc: dict[str, Any]) -> str:
    """The title of a results document's config (documents written before titles existed: the
    id, humanised)."""
    return (doc.get("config") or {}).get("title") or humanise_id(str(doc["experiment"]))


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


def _known(name: str, names: Iterable[str], what: str) -> str:
    """``name`` if it is one of ``names``; else the error every registry field gives."""
    names = list(names)
    if name not in names:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(names)}")
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadSpec(_Strict):
    """Which synthetic workload (``skv.workloads.WORKLOADS``) and its parameters.

    ``seed`` is not a parameter here: the experiment's ``seeds`` set it, one run per seed.
    """

    name: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        known = _workload_names()
        return name if known is None else _known(name, known, "workload")

    @field_validator("params")
    @classmethod
    def _params_accepted(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "seed" in params:
            raise ValueError("set seeds with the experiment's top-level 'seeds' list, not here")
        name = info.data.get("name")
        model = _workload_params_model(name) if name else None
        if model is not None:
            try:
                model(**params)
            except ValidationError as exc:
                raise ValueError(f"workload {name!r}: {_flatten(exc)}") from None
        return params


class PolicySpec(_Strict):
    """One eviction policy (``skv.policies.registry.POLICIES``); ``label`` tells apart two
    entries of the same policy with different parameters (default: the name)."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("name")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from skv.policies.registry import POLICIES

        return _known(name, POLICIES, "policy")

    @model_validator(mode="after")
    def _params_accepted(self) -> PolicySpec:
        from skv.policies.registry import make_cache

        try:
            make_cache(self.name, 4, self.params)  # a tiny cache: checks the parameters only
        except (ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def key(self) -> str:
        """The name results use for this entry."""
        return self.label or self.name

    @property
    def offline(self) -> bool:
        from skv.policies.registry import OFFLINE

        return self.name in OFFLINE


class LatencySpec(_Strict):
    """The latency model (``skv.latency.LATENCY_MODELS``) that prices every iteration."""

    name: str = "linear"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _buildable(self) -> LatencySpec:
        from skv.latency import make_latency_model

        make_latency_model(self.name, **self.params)  # ValueError names the bad parameter
        return self


class ReplicaSpec(_Strict):
    """How many replicas serve the workload and which router spreads requests over them."""

    count: int = Field(default=1, ge=1, le=64)
    router: str = "round_robin"
    router_params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("router")
    @classmethod
    def _known_router(cls, router: str) -> str:
        from skv.routing import ROUTERS

        return _known(router, ROUTERS, "router")

    @model_validator(mode="after")
    def _router_params_accepted(self) -> ReplicaSpec:
        from skv.routing import make_router

        make_router(self.router, **self.router_params)  # ValueError names the bad parameter
        return self


class BatchSpec(_Strict):
    """Per-replica continuous-batching limits (vLLM's max_num_batched_tokens / max_num_seqs)."""

    max_batch_tokens: int = Field(default=8192, ge=1)
    max_running: int = Field(default=256, ge=1)


class SeedClaim(_Strict):
    """What the seed system (SemanticKV) reports for this scenario, so the summary can say
    whether this run reproduces it. Stated before running; never adjusted to the outcome."""

    winner: str
    metric: str = "ttft_ms_mean"
    text: str = ""

    @field_validator("winner")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from skv.policies.registry import POLICIES

        return _known(name, POLICIES, "policy")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        return _known(metric, METRICS, "metric")


class ExperimentConfig(_Strict):
    """One experiment: workload x seeds x capacities x policies through the simulator."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)
    #: what figures and reports call the experiment (default: the id, humanised)
    title: str = Field(default="", max_length=120, validate_default=True)
    description: str = ""
    workload: WorkloadSpec
    policies: list[PolicySpec] = Field(min_length=1)
    capacities: list[str | int] = Field(min_length=1)
    latency: LatencySpec = Field(default_factory=LatencySpec)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec)
    block_size: int = Field(default=16, ge=1, le=4096)
    keying: Literal["prefix", "segment"] = "prefix"
    salt_by_tenant: bool = False
    batch: BatchSpec = Field(default_factory=BatchSpec)
    model: str | None = None
    include_output_blocks: bool = True
    sample_every_s: float = Field(default=1.0, gt=0)
    policy_metrics_every: int = Field(default=50, ge=0)
    seed_claim: SeedClaim | None = None
    in_suite: bool = True

    @field_validator("title")
    @classmethod
    def _default_title(cls, title: str, info: ValidationInfo) -> str:
        return title.strip() or humanise_id(str(info.data.get("id", "")))

    @field_validator("capacities")
    @classmethod
    def _parse_capacities(cls, caps: list[str | int]) -> list[str | int]:
        for i, cap in enumerate(caps):
            try:
                Capacity.parse(cap)
            except ValueError as exc:
                raise ValueError(f"entry {i}: {exc}") from None
        if len({str(c) for c in caps}) != len(caps):
            raise ValueError("duplicate entries")
        return caps

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        if any(s < 0 for s in seeds):
            raise ValueError("seeds must be >= 0")
        if len(set(seeds)) != len(seeds):
            raise ValueError("duplicate seeds")
        return seeds

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | None) -> str | None:
        if model is not None:
            from skv.sizing import get_model

            get_model(model)
        return model

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        keys = [p.key for p in self.policies]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(
                f"policies: duplicate entries {dupes}; give each variant its own 'label'"
            )
        if self.model is None:
            for cap in self.capacities:
                if Capacity.parse(cap).kind == "bytes":
                    raise ValueError(f"capacity {cap!r} is in bytes: set 'model' (a preset)")
        if self.seed_claim is not None and self.seed_claim.winner not in {
            p.name for p in self.policies
        }:
            raise ValueError(
                f"seed_claim.winner {self.seed_claim.winner!r} is not among the policies"
            )
        return self

    @property
    def online_policies(self) -> list[PolicySpec]:
        return [p for p in self.policies if not p.offline]


# ----------------------------------------------------------------------------------------
# loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML would keep the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate one YAML config; ``id`` defaults to the file's stem.

    Raises :class:`ConfigError` (a ``ValueError``) naming the file and the offending field,
    or ``FileNotFoundError``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such experiment config")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    return config_from_dict(data, source=path)


def config_from_dict(data: Any, *, source: str | Path = "<config>") -> ExperimentConfig:
    """Validate a parsed config mapping; errors are prefixed with ``source``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at top level, got {type(data).__name__}")
    data = dict(data)
    if "id" not in data and isinstance(source, Path):
        data["id"] = source.stem
    try:
        return ExperimentConfig(**data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_flatten(exc)}") from None
    except ValueError as exc:  # raised outside pydantic's wrapping (should be rare)
        raise ConfigError(f"{source}: {exc}") from None


def _flatten(exc: ValidationError, prefix: str = "") -> str:
    """One line per error: ``field.path: message`` (pydantic's 'Value error, ' prefix cut)."""
    lines = []
    for err in exc.errors():
        loc = _loc(err.get("loc", ()), prefix)
        msg = re.sub(r"^(Value|Assertion) error, ", "", str(err.get("msg", "")))
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (not allowed here; check the spelling)"
        elif err.get("type") == "missing":
            msg = "required field missing"
        elif isinstance(err.get("input"), str | int | float | bool) and "got" not in msg:
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def _loc(loc: tuple[Any, ...], prefix: str) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_TAGS or "[" in str(part) or "(" in str(part):
            continue  # pydantic's union / validator tags, not field names
        else:
            out += f".{part}" if out else str(part)
    return out


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


# ----------------------------------------------------------------------------------------
# the workload registry (written in parallel; validate against it when it is importable)


def _workload_registry() -> dict[str, Any] | None:
    try:
        from skv.workloads import WORKLOADS
    except ImportError:
        return None
    return WORKLOADS


def _workload_names() -> list[str] | None:
    reg = _workload_registry()
    return None if reg is None else list(reg)


def _workload_params_model(name: str) -> Any:
    """The workload's pydantic params model, when the registry exposes one."""
    reg = _workload_registry()
    if reg is None or name not in reg:
        return None
    entry = reg[name]
    for attr in ("params_model", "Params", "params"):
        model = getattr(entry, attr, None)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model
    return None
