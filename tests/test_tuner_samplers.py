"""The default sampler's pieces over an enumerated space (tuner/search/samplers.py): TPE drawing its
candidates from the accepted configs, the geometry-group step after the start-up, and a start-up
that warm-start trials do not shorten."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kernels
import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from tuner.measure.replay import ReplayEvaluator
from tuner.problem import config_key
from tuner.search import prior, space
from bench_support import bench_module
from tuner.search.samplers import (GROUP_TRIES, STARTUP_TRIALS, Deferred, EnumeratedTPE,
                                   FeasibleSampler, SearchSpace, _key, _seen, _Table,
                                   make_sampler)

RECORDING = Path(__file__).parent / "data" / "recordings" / "h100-warptile-vectorized.json.gz"
# warptile narrowed to the recorded grid: 602 accepted configs in 34 geometry groups at 2048³
WARPTILE = ReplayEvaluator.open(RECORDING).family(kernels.get_family("warptile"))
SHAPE = (2048, 2048, 2048)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def grouped():
    accepted = [c for c in WARPTILE.accepted_configs() if not WARPTILE.reject_reasons(c, "sm_90")]
    groups = prior.group_configs(WARPTILE, accepted, *SHAPE)
    positions = [[space.params_from_config(WARPTILE, c) for c in members]
                 for _, members in groups.values()]
    return accepted, groups, positions


def _speed(config: dict[str, int]) -> float:
    """A made-up objective with one clear optimum among the accepted configs."""
    return 1000.0 / (1 + abs(config["BM"] - 128) / 32 + abs(config["BN"] - 64) / 32
                     + abs(config["WM"] - 64) / 16 + (config["TM"] != 8) + (config["BK"] != 16))


def _run(sampler: optuna.samplers.BaseSampler, asks: int, warm: list[dict[str, int]] = ()
         ) -> list[dict[str, int]]:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for config in warm:
        study.enqueue_trial(space.params_from_config(WARPTILE, config),
                            user_attrs={"warm_start": True})
    asked = []
    for _ in range(asks):
        trial = study.ask(space.distributions(WARPTILE))
        config = space.config_from_params(WARPTILE, trial.params)
        asked.append(config)
        trial.set_user_attr("state", "ok")
        study.tell(trial, _speed(config))
    return asked


def test_enumerated_tpe_proposes_new_accepted_configs_and_learns(grouped):
    accepted, _, positions = grouped
    flat = [p for group in positions for p in group]
    best = max(_speed(c) for c in accepted)  # 9 of the 602 configs
    hits = {}
    for name, model in (("enumerated", lambda s: EnumeratedTPE(flat, seed=s, multivariate=True,
                                                                  n_startup_trials=0)),
                        ("uniform", lambda s: optuna.samplers.RandomSampler(seed=s))):
        hits[name] = 0
        for seed in range(8):
            sampler = FeasibleSampler(model(seed), SearchSpace(
                space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90")),
                seed=seed, startup_trials=STARTUP_TRIALS)
            asked = _run(sampler, 30)
            keys = [config_key(c) for c in asked]
            assert len(set(keys)) == len(keys) and all(WARPTILE.accepts(c) for c in asked)
            hits[name] += max(_speed(c) for c in asked) == best
    # within 30 of 602 configs the model finds an optimum in most runs, uniform draws rarely
    assert hits["enumerated"] >= 5 and hits["enumerated"] >= hits["uniform"] + 3, hits


def test_after_the_startup_every_second_ask_explores_the_best_group(grouped):
    accepted, groups, positions = grouped
    group_of = {config_key(c): key for key, (_, members) in groups.items() for c in members}
    startup = [space.params_from_config(WARPTILE, c) for c in accepted[:STARTUP_TRIALS]]
    sampler = make_sampler("default", 0, SearchSpace(
        space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90"), startup, positions))
    asked = _run(sampler, STARTUP_TRIALS + 2 * GROUP_TRIES + 4)
    assert asked[:STARTUP_TRIALS] == accepted[:STARTUP_TRIALS]
    steps = 0
    for index in range(STARTUP_TRIALS + 1, len(asked), 2):
        best = max(asked[:index], key=_speed)
        same = group_of[config_key(asked[index])] == group_of[config_key(best)]
        tried = sum(group_of[config_key(c)] == group_of[config_key(best)]
                    for c in asked[:index])
        room = len(groups[group_of[config_key(best)]][1])
        if tried < min(GROUP_TRIES, room):  # the group step (otherwise TPE, which may agree)
            assert same, (index, tried, room)
            steps += 1
    assert steps >= GROUP_TRIES - 1
    # with GROUP_TRIES of the best group measured, the step gives way to the model
    best_group = groups[group_of[config_key(max(asked, key=_speed))]][1]
    trials = [optuna.trial.create_trial(
        params=space.params_from_config(WARPTILE, c), distributions=space.distributions(WARPTILE),
        value=_speed(c), user_attrs={"state": "ok"}) for c in best_group[:GROUP_TRIES]]
    names = list(sampler.varying)
    assert sampler._from_best_group(trials, names, _seen(trials, names)) == {}


def test_warm_start_trials_do_not_shorten_the_startup(grouped):
    accepted, _, positions = grouped
    warm, chosen = accepted[-2:], accepted[100:100 + STARTUP_TRIALS]
    sampler = make_sampler("default", 0, SearchSpace(
        space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90"),
        [space.params_from_config(WARPTILE, c) for c in chosen], positions))
    asked = _run(sampler, 2 + STARTUP_TRIALS, warm=warm)
    assert asked == warm + chosen


def test_asks_ahead_of_the_startup_results_continue_down_the_ranked_list(grouped):
    """A compile window asks several candidates before any result comes back: those take the
    prior's next picks, in order, not uniform draws."""
    accepted, _, positions = grouped
    ranked = accepted[200:200 + STARTUP_TRIALS + 5]
    sampler = make_sampler("default", 0, SearchSpace(
        space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90"),
        [space.params_from_config(WARPTILE, c) for c in ranked], positions))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    in_flight = [study.ask(space.distributions(WARPTILE)) for _ in range(len(ranked))]
    assert [space.config_from_params(WARPTILE, t.params) for t in in_flight] == ranked


def _proposals_digest(grouped, asks: int, window: int, deferred: bool = False) -> str:
    """The default sampler's proposals over ``asks`` asks with ``window`` candidates in flight
    (constant liar sees RUNNING trials), as a digest. ``deferred``: the groups handed over as a
    computation on a thread, as a study does."""
    accepted, _, positions = grouped
    startup = [space.params_from_config(WARPTILE, c) for c in accepted[:STARTUP_TRIALS]]
    groups = Deferred(lambda: positions) if deferred else positions
    sampler = make_sampler("default", 3, SearchSpace(
        space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90"), startup, groups))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    ask_cost = bench_module("ask_cost")
    asked, _ = ask_cost.propose(study, WARPTILE, asks, window, _speed)
    return ask_cost.digest(asked)


def test_the_default_samplers_proposals_are_pinned(grouped):
    """Same seed, same proposals: speed-ups of the ask (issue 19) must not change which configs
    it proposes. The digests were taken before those speed-ups; change them only together with
    a deliberate change of the search."""
    assert _proposals_digest(grouped, 40, 1) == "27d4a4a180f29da9"
    assert _proposals_digest(grouped, 40, 5) == "2c8f5752cb28dc64"
    assert _proposals_digest(grouped, 40, 5, deferred=True) == "2c8f5752cb28dc64"


def test_a_deferred_value_starts_with_its_source_or_when_asked_for():
    calls: list[str] = []
    source = Deferred(lambda: calls.append("source") or 2, start=False)
    doubled = source.then(lambda value: calls.append("doubled") or 2 * value, "doubled")
    assert not doubled._future.done() and calls == []  # nothing runs before the start
    source.start()
    assert doubled._future.result(timeout=10) == 4 and calls == ["source", "doubled"]
    # derived from a source already started: starts at once
    assert source.then(lambda value: value + 1, "late")._future.result(timeout=10) == 3
    # asked for before its owner started it: computed, not waited for forever
    assert Deferred(lambda: 7, start=False).get() == 7


def test_the_tables_built_in_the_background_are_the_ones_built_inline(grouped):
    """The TPE table and the group index are built on threads from the sampler's construction
    on (issue 19): the same arrays and dicts as built on the asking thread."""
    _, _, positions = grouped
    sampler = make_sampler("default", 0, SearchSpace(
        space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90"), (),
        Deferred(lambda: positions)))
    names = list(sampler.varying)
    flat = [dict(p) for group in positions for p in group]
    table, inline = sampler.model._table_over(names), _Table.build(flat, names)
    assert table is sampler.model._prepared.get()[1]  # the background one, not rebuilt
    assert table.names == inline.names and table.rows == inline.rows
    assert np.array_equal(table.values, inline.values)
    # the column-wise build gives what a row at a time gave
    assert np.array_equal(table.values, np.array([[float(p[n]) for n in names] for p in flat]))
    assert table.values.flags.c_contiguous
    assert list(table.rows.items()) == [(_key({n: p[n] for n in names}), row)
                                        for row, p in enumerate(flat)]
    for (distinct, inverse), (distinct_inline, inverse_inline) in zip(table.columns,
                                                                      inline.columns):
        assert np.array_equal(distinct, distinct_inline)
        assert np.array_equal(inverse, inverse_inline)
    assert sampler.model.accepted == flat
    groups, group_of = sampler._grouped.get()
    assert groups is positions
    inline_index = {_key({n: int(p[n]) for n in names}): index
                    for index, group in enumerate(positions) for p in group}
    assert list(group_of.items()) == list(inline_index.items())


def test_an_error_building_the_tables_surfaces_at_the_first_ask_that_needs_them(grouped):
    """The start-up asks need no table; the first model ask raises the build's error."""
    def broken() -> list:
        raise RuntimeError("no groups today")

    sampler = make_sampler("default", 0, SearchSpace(
        space.distributions(WARPTILE), space.feasibility(WARPTILE, "sm_90"), (),
        Deferred(broken)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(STARTUP_TRIALS):
        trial = study.ask(space.distributions(WARPTILE))
        trial.set_user_attr("state", "ok")
        study.tell(trial, _speed(space.config_from_params(WARPTILE, trial.params)))
    with pytest.raises(RuntimeError, match="no groups today"):
        study.ask(space.distributions(WARPTILE))


def test_the_ask_cost_bench_runs():
    bench = Path(__file__).resolve().parents[1] / "bench" / "ask_cost.py"
    out = subprocess.run([sys.executable, str(bench), "--family", "blocktile2d", "--asks", "12"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("blocktile2d: 5076 accepted configs, ") and "ms per ask" in out
