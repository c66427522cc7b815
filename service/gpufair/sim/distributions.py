"""Random quantities of a scenario's workload generators: job sizes and durations.

Written in YAML as one of

    4                                          a constant (durations also as `90s`, `2h`, `7d`)
    {choice: [1, 2, 4], weights: [6, 3, 1]}    one of the values (weights optional, default equal)
    {uniform: [1h, 4h]}                        uniform between the two bounds
    {exponential: 2h}                          exponential with this mean
    {lognormal: {median: 2h, sigma: 1.0}}      log-normal: exp(N(ln median, sigma²))

and, for the continuous ones, optional `min` and `max` that clip a draw. Each draw takes exactly
one value from the generator's own `random.Random`, so a stream is reproducible from its seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufair.config_file import ConfigFileError, parse_duration_s

_KINDS = ("choice", "uniform", "exponential", "lognormal")


@dataclass(frozen=True, slots=True)
class Distribution:
    kind: str  # constant | choice | uniform | exponential | lognormal
    values: tuple[float, ...] = ()  # constant: (value,); choice: the values; uniform: (lo, hi)
    weights: tuple[float, ...] = ()  # choice only
    mean: float = 0.0  # exponential
    median: float = 0.0  # lognormal
    sigma: float = 0.0  # lognormal
    lower: float = -math.inf  # clip
    upper: float = math.inf

    def sample(self, rng: random.Random) -> float:
        if self.kind == "constant":
            return self.values[0]
        if self.kind == "choice":
            if not self.weights:
                return self.values[rng.randrange(len(self.values))]
            return rng.choices(self.values, weights=self.weights, k=1)[0]
        if self.kind == "uniform":
            value = rng.uniform(self.values[0], self.values[1])
        elif self.kind == "exponential":
            value = rng.expovariate(1.0 / self.mean)
        else:
            value = rng.lognormvariate(math.log(self.median), self.sigma)
        return min(max(value, self.lower), self.upper)

    @property
    def always_positive(self) -> bool:
        """Whether every draw is > 0 (exponential and log-normal draws are, unless clipped)."""
        if self.kind in ("constant", "choice", "uniform"):
            return max(min(self.values), self.lower) > 0.0
        return self.lower == -math.inf or self.lower > 0.0


def constant(value: float) -> Distribution:
    return Distribution("constant", (float(value),))


def _number(value: Any, seconds: bool, what: str) -> float:
    if seconds and isinstance(value, str):
        try:
            value = parse_duration_s(value, what)
        except ConfigFileError as exc:
            raise ValueError(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        kind = "a number or a duration such as 90s, 2h, 7d" if seconds else "a number"
        raise ValueError(f"{what}: expected {kind}, got {value!r}")
    return float(value)


def _numbers(value: Any, seconds: bool, what: str) -> tuple[float, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{what}: expected a non-empty list")
    return tuple(_number(v, seconds, f"{what}[{i}]") for i, v in enumerate(value))


def parse_distribution(
    spec: Any, *, seconds: bool = False, integer: bool = False, positive: bool = True
) -> Distribution:
    """A `Distribution` from its YAML form (module docstring); raises ValueError with a message
    that names the offending part. `integer`: only constants and choices of whole numbers."""
    if isinstance(spec, Distribution):
        return spec
    if not isinstance(spec, Mapping):
        dist = constant(_number(spec, seconds, "value"))
    else:
        kinds = [k for k in _KINDS if k in spec]
        unknown = sorted(str(k) for k in spec if k not in (*_KINDS, "weights", "min", "max"))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; a distribution has one of {_KINDS}")
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of {', '.join(_KINDS)}")
        dist = _parse_kind(kinds[0], spec, seconds)
    if integer and (
        dist.kind not in ("constant", "choice") or any(v != int(v) for v in dist.values)
    ):
        raise ValueError("must be a whole number or a choice of whole numbers")
    if positive and not dist.always_positive:
        raise ValueError("every value must be > 0")
    return dist


def _parse_kind(kind: str, spec: Mapping[Any, Any], seconds: bool) -> Distribution:
    lower = _number(spec["min"], seconds, "min") if "min" in spec else -math.inf
    upper = _number(spec["max"], seconds, "max") if "max" in spec else math.inf
    if lower > upper:
        raise ValueError("min is above max")
    if "weights" in spec and kind != "choice":
        raise ValueError("weights belong to a choice")
    if kind == "choice":
        values = _numbers(spec["choice"], seconds, "choice")
        weights: tuple[float, ...] = ()
        if "weights" in spec:
            weights = _numbers(spec["weights"], False, "weights")
            if len(weights) != len(values) or any(w < 0 for w in weights) or sum(weights) <= 0:
                raise ValueError("weights: one weight ≥ 0 per value, not all 0")
        if "min" in spec or "max" in spec:
            raise ValueError("min and max apply to continuous distributions, not a choice")
        return Distribution("choice", values, weights)
    if kind == "uniform":
        bounds = _numbers(spec["uniform"], seconds, "uniform")
        if len(bounds) != 2 or bounds[0] > bounds[1]:
            raise ValueError("uniform: expected [low, high] with low ≤ high")
        return Distribution("uniform", bounds, lower=lower, upper=upper)
    if kind == "exponential":
        mean = _number(spec["exponential"], seconds, "exponential")
        if mean <= 0:
            raise ValueError("exponential: the mean must be > 0")
        return Distribution("exponential", mean=mean, lower=lower, upper=upper)
    params = spec["lognormal"]
    if not isinstance(params, Mapping) or set(params) != {"median", "sigma"}:
        raise ValueError("lognormal: expected {median: ..., sigma: ...}")
    median = _number(params["median"], seconds, "lognormal.median")
    sigma = _number(params["sigma"], False, "lognormal.sigma")
    if median <= 0 or sigma < 0:
        raise ValueError("lognormal: median must be > 0 and sigma ≥ 0")
    return Distribution("lognormal", median=median, sigma=sigma, lower=lower, upper=upper)
