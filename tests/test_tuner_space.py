"""The study's parameter encoding (ordered positions) and the default sampler's proposals, on
real kernel families and real Optuna studies."""

from __future__ import annotations

import kernels
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from tuner.problem import config_key
from tuner.search import space
from tuner.search.samplers import FeasibleSampler, SearchSpace, make_sampler

WARPTILE = kernels.FAMILIES["warptile"]
BLOCKTILE1D = kernels.FAMILIES["blocktile1d"]

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize("family", [WARPTILE, BLOCKTILE1D], ids=lambda f: f.name)
def test_every_accepted_config_round_trips_through_the_positions(family):
    dists = space.distributions(family)
    for config in family.accepted_configs():
        params = space.params_from_config(family, config)
        for name, position in params.items():
            assert dists[name]._contains(position)  # a value the study may hold
        assert space.config_from_params(family, params) == config


def test_positions_follow_the_sorted_values():
    dists = space.distributions(WARPTILE)
    for param in WARPTILE.params:
        values = sorted(param.values)
        assert dists[param.name] == IntDistribution(0, len(values) - 1)
        config = {p.name: sorted(p.values)[0] for p in WARPTILE.params}
        config[param.name] = values[-1]
        assert space.params_from_config(WARPTILE, config)[param.name] == len(values) - 1


def test_a_value_the_family_lacks_is_refused_by_name():
    config = {p.name: sorted(p.values)[0] for p in WARPTILE.params}
    config["BM"] = 48
    with pytest.raises(ValueError, match="BM=48 is not allowed; allowed values are 32, 64"):
        space.params_from_config(WARPTILE, config)
    with pytest.raises(ValueError, match="position 9 is outside"):
        space.config_from_params(WARPTILE, {**space.params_from_config(
            WARPTILE, WARPTILE.accepted_configs()[0]), "BM": 9})


def test_trials_stored_with_real_values_are_read_and_reencoded():
    config = WARPTILE.accepted_configs()[5]
    old = {p.name: CategoricalDistribution(tuple(sorted(p.values))) for p in WARPTILE.params}
    stored = create_trial(state=TrialState.COMPLETE, value=123.0, params=dict(config),
                          distributions=old, user_attrs={"state": "ok"})
    assert space.config_from_params(WARPTILE, stored.params, stored.distributions) == config
    (again,) = space.reencode_trials(WARPTILE, [stored])
    assert again.distributions == space.distributions(WARPTILE)
    assert again.params == space.params_from_config(WARPTILE, config)
    assert again.value == 123.0 and again.user_attrs == {"state": "ok"}


def _study_with(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    return optuna.create_study(direction="maximize", sampler=sampler)


def test_the_default_sampler_proposes_only_new_accepted_configs():
    dists = space.distributions(WARPTILE)
    search_space = SearchSpace(dists, space.feasibility(WARPTILE, "sm_90"))
    sampler = make_sampler("prior", 1, search_space)
    assert isinstance(sampler, FeasibleSampler)
    study = _study_with(sampler)
    seen = set()
    for number in range(30):  # past the random start-up into the model's proposals
        trial = study.ask(dists)
        config = space.config_from_params(WARPTILE, trial.params)
        assert WARPTILE.accepts(config), config
        key = config_key(config)
        assert key not in seen
        seen.add(key)
        study.tell(trial, float(config["BM"] * config["BN"] + number))  # prefers big tiles
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}


def test_every_accepted_config_is_proposable_and_the_space_is_then_exhausted():
    """A small space: the default sampler walks through every accepted config exactly once,
    then has nothing left to propose (an empty relative sample)."""
    family = kernels.FAMILIES["naive"]
    dists = space.distributions(family)
    accepted = {config_key(c) for c in family.accepted_configs()}
    search_space = SearchSpace(dists, space.feasibility(family, "sm_90"))
    study = _study_with(make_sampler("prior", 0, search_space))
    proposed = set()
    for _ in range(len(accepted)):
        trial = study.ask(dists)
        proposed.add(config_key(space.config_from_params(family, trial.params)))
        study.tell(trial, 1.0)
    assert proposed == accepted
    sampler = study.sampler
    assert sampler.sample_relative(study, study.ask(), sampler.varying) == {}


def test_many_configs_to_positions_at_once_as_one_by_one():
    configs = BLOCKTILE1D.accepted_configs("sm_90")
    assert space.params_from_configs(BLOCKTILE1D, configs) == [
        space.params_from_config(BLOCKTILE1D, c) for c in configs]
    wrong = dict(configs[0], BM=12345)
    with pytest.raises(ValueError, match="BM=12345 is not allowed"):
        space.params_from_configs(BLOCKTILE1D, [configs[0], wrong])
    with pytest.raises(KeyError):
        space.params_from_configs(BLOCKTILE1D, [{k: v for k, v in configs[0].items()
                                                 if k != "BM"}])
