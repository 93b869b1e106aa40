"""A kernel family's declared parameters as Optuna distributions."""

from __future__ import annotations

from typing import Any, Mapping

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution


def _evenly_spaced(values: tuple[int, ...]) -> bool:
    if len(values) < 3:
        return False
    step = values[1] - values[0]
    return step > 0 and all(b - a == step for a, b in zip(values, values[1:]))


def distributions(family: Any) -> dict[str, BaseDistribution]:
    """Evenly spaced values become an ordered int range (the sampler may exploit the order);
    anything else (powers of two, short lists) stays categorical so that every value the
    family allows — and nothing else — can be proposed."""
    result: dict[str, BaseDistribution] = {}
    for param in family.params:
        values = tuple(sorted(int(v) for v in param.values))
        if _evenly_spaced(values):
            result[param.name] = IntDistribution(values[0], values[-1], step=values[1] - values[0])
        else:
            result[param.name] = CategoricalDistribution(values)
    return result


def config_from_params(params: Mapping[str, Any]) -> dict[str, int]:
    return {name: int(value) for name, value in params.items()}


def config_key(config: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """A hashable, order-independent identity of a config."""
    return tuple(sorted((name, int(value)) for name, value in config.items()))


def representable(family: Any, config: Mapping[str, Any]) -> bool:
    """Whether ``config`` names exactly the family's parameters with allowed values (e.g. a
    warm-start config from an older version of the family may not)."""
    allowed = {param.name: {int(v) for v in param.values} for param in family.params}
    if set(config) != set(allowed):
        return False
    try:
        return all(int(config[name]) in allowed[name] for name in allowed)
    except (TypeError, ValueError):
        return False
