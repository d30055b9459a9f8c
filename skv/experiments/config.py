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
blocks (``10%``; resolved per seed, since each seed draws a different trace). One that resolves
to less than one block is an error at load (a share: when the seed's trace is known).

Sizes are bounded before anything is built from them, each error naming file and field:

- the file: at most :data:`MAX_CONFIG_BYTES` (1 MiB), UTF-8 text; after YAML anchors are
  expanded at most :data:`MAX_CONFIG_VALUES` (10,000) values, nested at most
  :data:`MAX_CONFIG_DEPTH` (32) deep. The largest shipped config is under 2 KB and 50 values;
  the bound stops an alias bomb ("billion laughs": a 1 KB file that expands to 10^9 strings)
  before anything formats or validates it. :func:`read_yaml` applies them for every study's
  config loader (replay, session gap, engine studies too).
- the experiment: at most :data:`MAX_LIST` (100) policies, capacities and seeds each, and
  :data:`MAX_CELLS` (10,000) simulations (seeds x capacities x policies): each cell is a full
  simulation and one record in ``results.json``; the suite's largest has 200.
- the workload: ``num_requests`` and the other size parameters are bounded by the workload's
  own parameter model (:mod:`skv.workloads.base`: at most 1,000,000 requests).
- batching: ``max_batch_tokens`` at most 2**24 and ``max_running`` at most 2**20, far above any
  engine's setting (vLLM: 8,192 tokens and 256 sequences by default).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

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

M = TypeVar("M", bound=BaseModel)

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


#: bounds on a config file before any model sees it (module docstring)
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 10_000
MAX_CONFIG_DEPTH = 32
#: entries of each of an experiment's policies, capacities and seeds lists
MAX_LIST = 100
#: simulations of one experiment (seeds x capacities x policies)
MAX_CELLS = 10_000
#: the experiment's lists bounded by MAX_LIST
_LISTS = ("policies", "capacities", "seeds")
#: characters of an offending value quoted in an error message
_QUOTE_CHARS = 60


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


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
            text = str(exc)  # the registry quotes the parameters: keep the message short
            raise ValueError(text if len(text) <= 300 else text[:297] + "...") from None
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
    """How many replicas serve the workload and which router spreads requests over them.

    ``view``: what a cache-aware router reads as a replica's cache (:mod:`skv.sim.routers`):
    ``exact`` (default: the replica's own cache, an idealised router) or ``approximate`` (the
    router's own LRU of the prompts it routed there, as the router service keeps; ``precise``
    always reads the exact cache). ``cache_blocks``: the approximate cache per replica in blocks
    (default: the replica's cache capacity)."""

    count: int = Field(default=1, ge=1, le=64)
    router: str = "round_robin"
    router_params: dict[str, Any] = Field(default_factory=dict)
    view: str = "exact"
    cache_blocks: int | None = Field(default=None, ge=1)

    @field_validator("router")
    @classmethod
    def _known_router(cls, router: str) -> str:
        from skv.routing import ROUTERS

        return _known(router, ROUTERS, "router")

    @field_validator("view")
    @classmethod
    def _known_view(cls, view: str) -> str:
        from skv.sim.routers import VIEWS

        return _known(view, VIEWS, "router view")

    @model_validator(mode="after")
    def _router_params_accepted(self) -> ReplicaSpec:
        from skv.routing import make_router

        make_router(self.router, **self.router_params)  # ValueError names the bad parameter
        return self


class BatchSpec(_Strict):
    """Per-replica continuous-batching limits (vLLM's max_num_batched_tokens / max_num_seqs);
    bounded far above any engine's setting (module docstring)."""

    max_batch_tokens: int = Field(default=8192, ge=1, le=1 << 24)
    max_running: int = Field(default=256, ge=1, le=1 << 20)


class TiersSpec(_Strict):
    """Lower KV tiers under every replica's GPU cache (the ``capacities`` above are then the GPU
    tier's; :mod:`skv.tiers`, docs/tiers.md): ``lower`` top down as
    ``NAME=SIZE[@POLICY][,link=LINK]``; how blocks move; whether loads overlap compute; whether a
    lower-tier run is loaded only when cheaper than recomputing it."""

    lower: list[str] = Field(min_length=1, max_length=4)
    write: Literal["through", "evict"] = "through"
    load: Literal["copy", "move"] = "copy"
    overlap: bool = False
    choice: Literal["cheaper", "load"] = "cheaper"

    @field_validator("lower")
    @classmethod
    def _parse(cls, lower: list[str]) -> list[str]:
        from skv.tiers import TierSpec

        for i, spec in enumerate(lower):
            try:
                TierSpec.parse(spec)
            except ValueError as exc:
                raise ValueError(f"entry {i}: {exc}") from None
        return lower

    @model_validator(mode="after")
    def _movable(self) -> TiersSpec:
        from skv.tiers import TierSpec, check_move_policies

        if self.load == "move":
            check_move_policies([TierSpec.parse(s).policy for s in self.lower])
        return self


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
    policies: list[PolicySpec] = Field(min_length=1, max_length=MAX_LIST)
    capacities: list[str | int] = Field(min_length=1, max_length=MAX_LIST)
    latency: LatencySpec = Field(default_factory=LatencySpec)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_LIST)
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
    #: lower KV tiers under the GPU cache (None: one cache level, every hit free)
    tiers: TiersSpec | None = None
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
        cells = len(self.seeds) * len(self.capacities) * len(self.policies)
        if cells > MAX_CELLS:
            raise ValueError(
                f"seeds x capacities x policies = {cells} simulations; at most {MAX_CELLS} "
                "per experiment (split it into several configs)"
            )
        keys = [p.key for p in self.policies]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(
                f"policies: duplicate entries {dupes}; give each variant its own 'label'"
            )
        for i, cap in enumerate(self.capacities):
            spec = Capacity.parse(cap)
            if spec.kind == "bytes" and self.model is None:
                raise ValueError(f"capacities[{i}]: {cap!r} is in bytes: set 'model' (a preset)")
            if spec.kind != "fraction":  # a share resolves once the seed's trace is known
                try:
                    spec.to_blocks(block_size=self.block_size, model=self.model)
                except ValueError as exc:
                    raise ValueError(f"capacities[{i}]: {exc}") from None
        if self.tiers is not None:
            from skv.policies.registry import OFFLINE

            if self.model is None:
                raise ValueError("tiers: set 'model' (a preset): transfers are priced in bytes")
            for p in self.policies:
                if p.name == "vllm" or p.name in OFFLINE:
                    raise ValueError(f"tiers: policy {p.key!r} cannot run a GPU tier over tiers")
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


def read_yaml(
    path: str | Path, what: str = "config", *, list_limits: Mapping[str, int] | None = None
) -> Any:
    """A YAML config file's data, after the checks every config loader needs.

    Refused, with a :class:`ConfigError` naming the file (and the field where there is one):
    more than :data:`MAX_CONFIG_BYTES`, not UTF-8, invalid YAML (line and column), a
    duplicate key, or data that expands (YAML anchors and aliases) to more than
    :data:`MAX_CONFIG_VALUES` values or nests deeper than :data:`MAX_CONFIG_DEPTH`.
    ``list_limits``: top-level list fields and their own bound (an experiment's ``seeds``:
    :data:`MAX_LIST`), checked first so a long list is refused with its real limit.
    ``FileNotFoundError`` when there is no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such {what}")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: {size} bytes, over the limit of {MAX_CONFIG_BYTES} for a config file "
            "(is this the right file?)"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); expected a YAML {what}"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{path}: invalid YAML value: {_quote(str(exc))}") from None
    _check_lists(data, path, list_limits or {}, what)
    _check_size(data, path)
    return data


def _check_lists(data: Any, path: Path, limits: Mapping[str, int], what: str) -> None:
    """A top-level list longer than its field's own bound: refused naming that bound."""
    if not isinstance(data, dict):
        return
    for name, limit in limits.items():
        value = data.get(name)
        if isinstance(value, list) and len(value) > limit:
            raise ConfigError(
                f"{path}: {name}: {len(value)} entries; an {what} takes at most {limit} "
                f"{name} (and at most {MAX_CELLS} simulations, seeds x capacities x policies)"
            )


def _has_aliases(data: Any) -> bool:
    """Whether a container appears twice in the data (a YAML alias ``*name`` of an anchor
    ``&name`` is the same object): each distinct container is visited once, so an alias bomb
    is not expanded."""
    seen: set[int] = set()
    stack = [data]
    while stack:
        obj = stack.pop()
        if not isinstance(obj, dict | list):
            continue
        if id(obj) in seen:
            return True
        seen.add(id(obj))
        stack.extend(obj.values() if isinstance(obj, dict) else obj)
    return False


def read_model(path: str | Path, model: type[M], what: str) -> tuple[dict[str, Any], M]:
    """A YAML config (:func:`read_yaml`) that must be a mapping, validated as ``model``: the
    raw mapping (for overrides merged onto it) and the model. Errors name the file and field."""
    data = read_yaml(path, what) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
    try:
        return data, model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc)}") from None


def read_model_quick(path: str | Path, model: type[M], what: str, *, quick: bool) -> M:
    """:func:`read_model`, then in a quick run the config's own ``quick:`` mapping laid over
    its top-level fields (validated again; errors name ``quick overrides``)."""
    data, cfg = read_model(path, model, what)
    over = getattr(cfg, "quick", None)
    if quick and over:
        try:
            cfg = model.model_validate({**data, **over, "quick": {}})
        except ValidationError as exc:
            raise ConfigError(f"{path}: quick overrides: {_flatten(exc)}") from None
    return cfg


def _check_size(data: Any, path: Path) -> None:
    """Count values as a reader of the data sees them (an alias counts each time it is used),
    stopping at the first bound crossed: its field is named, nothing is expanded (a container's
    entries are counted before any of them is visited)."""
    count = 1
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        obj, loc, depth = stack.pop()
        if not isinstance(obj, dict | list):
            continue
        problem = None
        if depth >= MAX_CONFIG_DEPTH:
            problem = f"nesting deeper than {MAX_CONFIG_DEPTH}"
        elif count + len(obj) > MAX_CONFIG_VALUES:
            problem = f"more than {MAX_CONFIG_VALUES} values"
        if problem is not None:
            field = re.sub(r"(\[\d+\])+$", "", loc) or "<top level>"
            if _has_aliases(data):
                why = "the config expands to {} (YAML anchors and aliases multiply)"
            else:
                why = "the config holds {}" + f" ({len(obj)} entries here)"
            raise ConfigError(
                f"{path}: {field}: {why.format(problem)}; a config file holds at most "
                f"{MAX_CONFIG_VALUES} values, nested at most {MAX_CONFIG_DEPTH} deep: configs "
                "are small by design"
            )
        count += len(obj)
        if isinstance(obj, dict):
            for key, value in obj.items():
                name = str(key)[:_QUOTE_CHARS]
                stack.append((value, f"{loc}.{name}" if loc else name, depth + 1))
        else:
            stack.extend((v, f"{loc}[{i}]", depth + 1) for i, v in enumerate(obj))


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate one YAML config; ``id`` defaults to the file's stem.

    Raises :class:`ConfigError` (a ``ValueError``) naming the file and the offending field,
    or ``FileNotFoundError``. The file is read by :func:`read_yaml` (size bounds).
    """
    path = Path(path)
    data = read_yaml(path, "experiment config", list_limits=dict.fromkeys(_LISTS, MAX_LIST))
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


def read_with_quick(
    path: str | Path, what: str, *, quick: bool, merged: Iterable[str] | None = None
) -> dict[str, Any]:
    """A study config's data with its ``quick:`` overrides applied when ``quick`` (the mapping is
    dropped either way). An override replaces the full run's value, except for the keys in
    ``merged`` (every key whose two values are mappings when ``merged`` is None), whose
    mappings merge key by key, so quick can shrink a part and keep the rest. A merged key that is
    not a mapping on either side is refused by name; so is a top level or ``quick`` that is not
    a mapping."""
    data = read_yaml(path, what)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
    over = data.pop("quick", None) or {}
    if not isinstance(over, dict):
        raise ConfigError(f"{path}: quick: expected a mapping of overrides")
    names = None if merged is None else tuple(merged)
    for k in names or ():
        if not isinstance(over.get(k, {}), dict) or not isinstance(data.get(k) or {}, dict):
            raise ConfigError(f"{path}: {k} and quick.{k}: expected mappings")
    if not quick:
        return data
    out = dict(data)
    for k, v in over.items():
        if names is None:
            merge = isinstance(v, dict) and isinstance(data.get(k), dict)
        else:
            merge = k in names
        out[k] = {**(data.get(k) or {}), **v} if merge else v
    return out


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
            msg = f"{msg} (got {_quote(err['input'])})"
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
