"""A kernel family's declared parameters as Optuna distributions, and back.

Encoding: every parameter is an ordered integer *position* into its sorted values
(``IntDistribution(0, len(values) - 1)``), so BM=32, 64, 128, 256 becomes 0, 1, 2, 3. The
samplers then see that 128 lies between 64 and 256 (TPE's kernels, GP's distances and CMA-ES's
steps all use the order), which a categorical encoding hides. Only the Optuna study holds
positions: configs (``dict[str, int]``) everywhere else — the results database, warm start,
recordings, Kernel Tuner export — hold the parameters' real values. Convert with
``config_from_params`` / ``params_from_config``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, create_trial


def _values(param: Any) -> tuple[int, ...]:
    return tuple(sorted(int(v) for v in param.values))


def distributions(family: Any) -> dict[str, BaseDistribution]:
    """Parameter name → position distribution over its sorted values."""
    return {param.name: IntDistribution(0, len(_values(param)) - 1) for param in family.params}


def _value_of(name: str, raw: Any, values: tuple[int, ...], dist: BaseDistribution | None,
              current: BaseDistribution) -> int:
    """The real value of one stored parameter. Trials stored before the position encoding
    carry the value itself (categorical, or an int range over the values)."""
    if dist is None or dist == current:
        index = int(raw)
        if not 0 <= index < len(values):
            raise ValueError(f"{name}: position {index} is outside 0..{len(values) - 1} "
                             f"(values {list(values)})")
        return values[index]
    if isinstance(dist, (CategoricalDistribution, IntDistribution)):
        return int(raw)
    raise ValueError(f"{name}: cannot read a {type(dist).__name__} parameter")


def config_from_params(family: Any, params: Mapping[str, Any],
                       distributions_: Mapping[str, BaseDistribution] | None = None
                       ) -> dict[str, int]:
    """The config (real values) of a trial's params. Pass the trial's own distributions for
    trials read from storage: those written before the position encoding hold real values."""
    current = distributions(family)
    config: dict[str, int] = {}
    for param in family.params:
        if param.name not in params:
            raise ValueError(f"family {family.name!r}: params lack {param.name}")
        dist = None if distributions_ is None else distributions_.get(param.name)
        config[param.name] = _value_of(param.name, params[param.name], _values(param), dist,
                                       current[param.name])
    return config


def params_from_config(family: Any, config: Mapping[str, int]) -> dict[str, int]:
    """The study's params (positions) of a config; ValueError for a value the family lacks."""
    return params_from_configs(family, [config])[0]


def params_from_configs(family: Any, configs: Iterable[Mapping[str, int]]
                        ) -> list[dict[str, int]]:
    """``params_from_config`` of many configs (a study's every accepted config: the positions
    are looked up in one table per parameter, built once)."""
    positions = [(param.name, {v: i for i, v in enumerate(_values(param))})
                 for param in family.params]
    result = []
    for config in configs:
        try:
            result.append({name: index[int(config[name])] for name, index in positions})
        except KeyError:
            for param in family.params:  # which one: a missing name stays a KeyError
                value = int(config[param.name])
                if value not in _values(param):
                    raise ValueError(
                        f"family {family.name!r}: {param.name}={value} is not allowed; "
                        f"allowed values are {', '.join(map(str, _values(param)))}") from None
            raise
    return result


def reencode_trials(family: Any, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials stored before the position encoding, rewritten in it (others unchanged), so that
    a resumed study's samplers see one consistent search space."""
    current = distributions(family)
    result = []
    for trial in trials:
        if trial.distributions == current:
            result.append(trial)
            continue
        config = config_from_params(family, trial.params, trial.distributions)
        result.append(create_trial(
            state=trial.state, value=trial.value, params=params_from_config(family, config),
            distributions=current, user_attrs=trial.user_attrs,
            system_attrs=trial.system_attrs, intermediate_values=trial.intermediate_values))
    return result


def feasibility(family: Any, arch: str) -> Callable[[Mapping[str, Any]], bool]:
    """params (positions) → whether the family's constraints accept that config."""

    def feasible(params: Mapping[str, Any]) -> bool:
        try:
            return not family.reject_reasons(config_from_params(family, params), arch)
        except ValueError:  # kernels.ConfigError
            return False

    return feasible


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
