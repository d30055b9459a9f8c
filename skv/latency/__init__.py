"""Latency models: the duration of one engine iteration, for the serving simulator.

One file per model, one registry. Names are what configs and the CLI use:

- ``linear``: the seed's ``base + per-token`` TTFT model (comparability with SemanticKV).
- ``roofline``: max(FLOPs, bytes) from a model preset and a GPU datasheet, with TP.
- ``calibrated``: a linear model fitted to measured TTFTs (``calibrated.fit``).

Every simulated result should carry ``model.describe()`` so it can say which model produced it.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Any

from skv.latency.base import Iteration, LatencyModel, PrefillChunk
from skv.latency.calibrated import CalibratedFit, CalibratedLatency, fit, fit_from_requests
from skv.latency.gpus import GPUS, GpuPreset, get_gpu
from skv.latency.linear import LinearLatency
from skv.latency.roofline import RooflineLatency

#: name -> class; ``make_latency_model`` builds one from keyword parameters
LATENCY_MODELS: dict[str, type[LatencyModel]] = {
    "linear": LinearLatency,
    "roofline": RooflineLatency,
    "calibrated": CalibratedLatency,
}


def model_params(name: str) -> dict[str, Any]:
    """Parameter name -> default (``inspect.Parameter.empty`` where required) for model ``name``."""
    cls = _model_class(name)
    return {
        p.name: p.default
        for p in inspect.signature(cls).parameters.values()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }


def make_latency_model(name: str, **params: Any) -> LatencyModel:
    """Build latency model ``name`` with ``params``; errors name the bad input and the choices."""
    cls = _model_class(name)
    accepted = model_params(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"latency model {name!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted)}"
        )
    missing = [k for k, v in accepted.items() if v is inspect.Parameter.empty and k not in params]
    if missing:
        hint = ""
        if name.lower() == "calibrated":
            hint = " (fit one with skv.latency.fit(...).to_model())"
        raise ValueError(
            f"latency model {name!r}: missing required parameter(s) {', '.join(missing)}{hint}"
        )
    for key, value in params.items():
        _check_type(name, key, value, accepted[key])
    return cls(**params)


def _check_type(model: str, key: str, value: Any, default: Any) -> None:
    """A parameter must have its default's kind: a number for a numeric default, a name (or a
    preset object) for a string default; otherwise a ValueError naming it (not a TypeError or
    AttributeError from deep inside the model)."""
    plain = (type(None), bool, int, float, str, list, tuple, dict)
    if isinstance(default, int | float) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"latency model {model!r}: {key} must be a number, got {value!r}")
    elif isinstance(default, str) and not isinstance(value, str) and isinstance(value, plain):
        raise ValueError(f"latency model {model!r}: {key} must be a name, got {value!r}")


def _model_class(name: str) -> type[LatencyModel]:
    try:
        return LATENCY_MODELS[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(
            f"unknown latency model {name!r}; known: {', '.join(LATENCY_MODELS)}"
        ) from None


__all__ = [
    "GPUS",
    "LATENCY_MODELS",
    "CalibratedFit",
    "CalibratedLatency",
    "GpuPreset",
    "Iteration",
    "LatencyModel",
    "LinearLatency",
    "PrefillChunk",
    "RooflineLatency",
    "fit",
    "fit_from_requests",
    "get_gpu",
    "make_latency_model",
    "model_params",
]
