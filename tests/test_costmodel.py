"""The learned cost model and ``--sampler model``: deterministic fits, the leave-one-out split of
the search benchmark, examples from a real results database, and a replayed study."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import optuna
import pytest

import db
import kernels

from tuner.measure.record import record_with_evaluator
from tuner.measure.recording import BUNDLED_RECORDINGS, load
from tuner.measure.replay import ReplayEvaluator
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem
from tuner.search.costmodel import (FEATURES, MAX_ITER, TRANSFER_COLUMNS, TRANSFER_FEATURES,
                                    CostModel, Example, Transfer, features, matrix,
                                    shape_distance)
from tuner.search.learned import (LARGE_FAMILIES, LARGE_FROM_SHAPES, LARGE_ROUNDS, TRUST_AFTER,
                                  Bases, LearnedSpace, breadth_first, decompositions,
                                  examples_for_study, examples_from_database,
                                  examples_from_recordings, model_picks, offline_model,
                                  problem_held_out, space_rows)
from tuner.search.prior import Target
from tuner.search.study import Budget, Session, run_study
from bench_support import search_efficiency

pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted(BUNDLED_RECORDINGS.glob("*.json.gz"))
# A fixed set of ten recordings for tests that learn from "some recorded data": whether a premise
# holds (e.g. that the model's unspread top 17 crowd a geometry group) depends on the data, and
# fitting on every bundled file would let each new one move the premise and grow the test's
# time (the slowest of these took 36 s on every file).
PINNED_RECORDINGS = [BUNDLED_RECORDINGS / f"{name}.json.gz" for name in (
    "h100-pipelined-3000x3000x3000", "h100-skinny-16x4096x4096+7x11008x4096",
    "h100-splitk-256x256x16384+512x384x8192", "h100-tf32x3-256x256x16384",
    "h100-tf32x3-3000x3000x3000", "h100-warptile+vectorized-1023x1025x999",
    "h100-warptile+vectorized-2048x2048x2048+1024x1024x1024",
    "h200-skinny-16x4096x4096+7x11008x4096", "h200-splitk-256x256x16384+512x384x8192",
    "h200-tf32x3-256x256x16384")]
H100 = Target(132, "sm_90")


@pytest.fixture(scope="module")
def recordings():
    return [load(path) for path in RECORDINGS]


@pytest.fixture(scope="module")
def pinned():
    return [load(path) for path in PINNED_RECORDINGS]


def test_features_are_finite_where_the_family_has_them():
    family = kernels.FAMILIES["warptile"]
    config = family.accepted_configs()[0]
    row = features(family, config, Problem(1023, 1025, 999), H100)
    assert len(row) == len(FEATURES)
    named = dict(zip(FEATURES, row))
    assert all(np.isfinite(named[f"p_{p.name}"]) for p in family.params)
    assert np.isnan(named["p_SPLITK"])  # a parameter warptile lacks
    assert 0 <= named["edge_waste"] < 1 and named["rounds"] >= 1


def test_feature_rows_are_each_configs_own():
    """``matrix`` builds its rows a column at a time (each launch geometry once, the parameters
    as arrays): every row must still hold its own config's geometry and parameter values."""
    family = kernels.FAMILIES["splitk"]
    configs = family.accepted_configs()[::4999]
    problem = Problem(333, 517, 10007)
    x = matrix(family, configs, problem, H100)
    assert x.shape == (len(configs), len(FEATURES))
    assert len({tuple(row) for row in x[:, :FEATURES.index("prior_rate")]}) > 5  # varied rows
    rate = FEATURES.index("prior_rate")
    own_rows = np.array([features(family, config, problem, H100) for config in configs])
    top_rate = own_rows[:, rate].max()
    for row, own, config in zip(x, own_rows, configs):
        assert np.array_equal(np.delete(row, rate), np.delete(own, rate), equal_nan=True)
        assert row[rate] == pytest.approx(own[rate] / top_rate)
        for param in family.params:
            assert row[FEATURES.index(f"p_{param.name}")] == (
                np.log2(config[param.name]) if config[param.name] > 0 else 0.0)
    assert np.isnan(x[:, FEATURES.index("p_ASPLIT")]).all()  # wgmma's: split-K lacks it


def test_the_fit_is_deterministic_with_a_fixed_seed(pinned):
    examples = examples_from_recordings(pinned)
    family = kernels.FAMILIES["vectorized"]
    candidates = family.accepted_configs()[:200]
    x = matrix(family, candidates, Problem(1500, 700, 3000), H100)
    first = CostModel(seed=7)
    first.add_examples(examples)
    second = CostModel(seed=7)
    second.add_examples(examples)
    a, b = first.fit().predict(x), second.fit().predict(x)
    assert np.array_equal(a, b)
    assert np.ptp(a) > 0  # it ranks, it does not predict one constant


def test_equal_weights_fit_the_model_a_weighted_fit_makes_bit_for_bit(pinned):
    """``CostModel.fit`` hands scikit-learn no weights where all are 1 (its weighted binning is
    the slow part of a fit): the model must be the one the same weights given explicitly make."""
    from sklearn.base import clone
    from threadpoolctl import threadpool_limits

    model = CostModel(seed=7)
    model.add_examples(examples_from_recordings(pinned))
    model.fit()
    x = np.concatenate(model._rows)[:, model._columns]
    y = np.concatenate(model._targets)
    with threadpool_limits(1):
        weighted = clone(model._model).fit(x, y, sample_weight=np.ones(len(x)))
    assert np.array_equal(model._model.predict(x), weighted.predict(x))
    assert np.ptp(weighted.predict(x)) > 0
    # unequal weights (a study's own rows weigh more) still reach the fit
    rows = np.concatenate(model._rows)
    heavier = model.copy()
    heavier.add(rows[:50], np.linspace(0.2, 1.0, 50), weight=3.0)
    heavier.fit()
    x3 = np.concatenate(heavier._rows)[:, heavier._columns]
    with threadpool_limits(1):
        explicit = clone(heavier._model).fit(x3, np.concatenate(heavier._targets),
                                             sample_weight=np.concatenate(heavier._weights))
        unweighted = clone(heavier._model).fit(x3, np.concatenate(heavier._targets))
    assert np.array_equal(heavier._model.predict(x3), explicit.predict(x3))
    assert not np.array_equal(explicit.predict(x3), unweighted.predict(x3))


def test_the_model_ranks_a_recorded_problem_it_was_fitted_on():
    """In-sample sanity check (not a measure of search quality): the configs predicted best
    on a problem it has seen include a near-optimal one."""
    recording = load(BUNDLED_RECORDINGS / "h100-blocktile1d-2048x2048x2048.json.gz")
    family_name, problem = recording.pairs()[0]
    model = CostModel(seed=0)
    model.add_examples(examples_from_recordings([recording]))
    results = [(c, r) for c, r in recording.results(family_name, problem) if r.usable]
    target = Target(recording.gpu["sm_count"], recording.arch)
    x = matrix(kernels.FAMILIES[family_name], [c for c, _ in results], problem, target)
    predicted = model.fit().predict(x)
    gflops = np.array([r.gflops for _, r in results])
    top = np.argsort(-predicted)[:10]
    assert gflops[top].max() >= 0.95 * gflops.max()


def test_leave_one_out_never_fits_on_the_problem_searched(recordings):
    bench = search_efficiency()
    path = str(next(p for p in RECORDINGS if p.name in bench.DESIGN_RECORDINGS))
    recording = load(path)
    gpu = recording.gpu["name"]
    # a job's others are the searched GPU model's recordings (bench.plan); another model's
    # measurements of the same problem are refused by training_for
    same = [(path, r) for path, r in zip(RECORDINGS, recordings) if r.gpu["name"] == gpu]
    for family, problem in recording.pairs():
        job = bench.Job(path, family, problem, "model", 0, 10, tuple(str(p) for p, _ in same))
        training = bench.training_for(job, gpu)
        assert training, "the other problems are there to learn from"
        # no example of the searched problem, of any family, on this GPU model
        assert not [e for e in training if e.gpu == gpu and e.problem == problem]
        shapes = {e.problem.shape for e in training}
        assert problem.shape not in shapes
        assert len(shapes) == len({p.shape for _, r in same for _, p in r.pairs()}) - 1
    # fitted leave-one-out, but the prior's estimate (a feature) was designed on this recording
    assert bench.fit_kind("model", Path(path).name) == "in-sample"
    assert bench.fit_kind("prior", Path(path).name) == "in-sample"
    assert bench.fit_kind("random", Path(path).name) == "-"
    fresh = next(p for p in RECORDINGS if p.name not in bench.DESIGN_RECORDINGS)
    assert bench.fit_kind("prior", fresh.name) == "not fitted on it"
    assert bench.fit_kind("model", fresh.name) == bench.fit_kind("default", fresh.name) \
        == "leave-one-out"


def test_held_out_helpers():
    assert problem_held_out("H100", "8x8x8")(("H100", "naive", "8x8x8"))
    assert not problem_held_out("H100", "8x8x8")(("H200", "naive", "8x8x8"))
    assert problem_held_out("H100", "8x8x8")(("H100", "smem", "8x8x8"))  # every family
    assert not problem_held_out("H100", "8x8x8")(("H100", "naive", "8x8x9"))


def _replay_study(tmp_path: Path, recording, problem: Problem, training, seed: int = 0,
                  trials: int = 12, name: str = "model.sqlite", sampler: str = "model"):
    database = db.open_database(f"sqlite:///{tmp_path / name}")
    replay = ReplayEvaluator(recording)
    info = replay.info()
    session = Session(database=database, evaluator=replay,
                      storage=optuna.storages.InMemoryStorage(),
                      gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                      sampler=sampler, seed=seed, warm_start=False, progress=False,
                      training=training)
    family = replay.family(kernels.get_family("naive"))
    outcome = run_study(session, family, problem, Budget(trials=trials, timeout_s=None,
                                                         patience=None))
    return database, outcome, replay


def test_model_sampler_searches_a_replayed_study_and_learns_from_the_database(tmp_path):
    naive = kernels.FAMILIES["naive"]
    problems = [Problem(512, 512, 512), Problem(256, 256, 1024)]
    recording = record_with_evaluator(StandInEvaluator(), [naive], problems, max_configs=1000)

    # first study: nothing to learn from (prior start-up, then its own measurements)
    database, outcome, replay = _replay_study(tmp_path, recording, problems[1], training=[])
    trials = database.run_history(outcome.run_id)
    measured = [t for t in trials if t.state not in ("rejected", "missing")]
    assert len(measured) == 12 == replay.evaluations
    assert len({tuple(sorted(t.params.items())) for t in measured}) == 12  # no repeats
    assert all(not naive.reject_reasons(t.params, "sm_90") for t in measured)

    # the database now holds that study's trials: they are the next study's examples, except
    # when the problem held out is that study's own
    gpu = replay.info()["name"]
    examples = examples_from_database(database, ["naive"])
    assert len(examples) == 12 and {e.problem for e in examples} == {problems[1]}
    assert examples_from_database(database, ["naive"],
                                  problem_held_out(gpu, problems[1].shape)) == []

    # a live study's examples hold out its own shape on its GPU model, of every family
    assert examples_for_study(database, gpu, problems[1], recordings=True) == []
    assert len(examples_for_study(database, gpu, problems[0], recordings=True)) == 12

    # second study, another problem: examples from the database (Session.training None)
    database.close()
    database, outcome, replay = _replay_study(tmp_path, recording, problems[0], training=None)
    assert replay.evaluations == 12 and outcome.best_gflops
    database.close()


def test_with_examples_of_other_families_only_the_model_sampler_starts_from_the_prior(
        tmp_path):
    """What other families teach the model transfers worse than the static prior (docs/search.md,
    "Why the default sampler is what it is"): with no other shape of the searched family among
    its examples, the model sampler measures the prior's start-up first, as the default does."""
    naive, smem = kernels.FAMILIES["naive"], kernels.FAMILIES["smem"]
    problems = [Problem(256, 256, 1024), Problem(512, 512, 512)]
    recording = record_with_evaluator(StandInEvaluator(), [naive, smem], problems,
                                      max_configs=1000)
    smem_only = [e for e in examples_from_recordings([recording]) if e.family == "smem"]
    assert smem_only

    def first_measured(database, outcome, count=4):
        trials = [t for t in database.run_history(outcome.run_id)
                  if t.state not in ("rejected", "missing")]
        return [t.params for t in trials[:count]]

    database, model_run, _ = _replay_study(tmp_path, recording, problems[0], smem_only,
                                           trials=6)
    model_first = first_measured(database, model_run)
    database.close()
    database, default_run, _ = _replay_study(tmp_path, recording, problems[0], None, trials=6,
                                             name="default.sqlite", sampler="default")
    assert model_first == first_measured(database, default_run)
    database.close()


def test_cli_offers_the_model_sampler(tmp_path):
    from tuner.search.choices import SAMPLERS
    from tuner.search.samplers import make_sampler

    assert "model" in SAMPLERS
    with pytest.raises(ValueError, match="enumerated accepted configs"):
        make_sampler("model", 0, None)




def test_an_examples_unit_and_sort_key_are_kept_and_it_pickles_as_its_fields(pinned):
    """``Example.unit`` and ``Example.identity`` are computed once per example (a start-up
    reads them for every bundled example, study after study); pickled for the preparing
    processes, an example carries its fields alone, equal on the other side, its keys the
    same when computed there; a changed example has its own."""
    import dataclasses
    import pickle

    example = examples_from_recordings(pinned)[0]
    assert "identity" not in example.__dict__
    key, unit = example.identity, example.unit
    assert example.identity is key and example.unit is unit  # kept, not built again
    assert unit == (example.gpu, example.family, example.problem.shape)
    assert key == (example.gpu, example.target.sm_count, example.target.arch, example.family,
                   example.problem.m, example.problem.n, example.problem.k,
                   example.problem.dtype, example.problem.layout,
                   example.problem.general_alpha_beta, tuple(sorted(example.config.items())),
                   example.gflops)
    back = pickle.loads(pickle.dumps(example, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == example and "identity" not in back.__dict__ and "unit" not in back.__dict__
    assert back.identity == key and back.unit == unit
    assert example.__getstate__() == tuple(getattr(example, f.name)
                                           for f in dataclasses.fields(example))
    other = dataclasses.replace(example, gflops=example.gflops + 1)
    assert other.identity != key and other.identity[-1] == example.gflops + 1


def test_examples_are_capped_keeping_the_family_own_first_whatever_their_order(pinned):
    from tuner.search.learned import IDENTITY, capped

    examples = examples_from_recordings(pinned)
    own = [e for e in examples if e.family == "warptile"]
    kept = capped(examples, "warptile", limit=len(own) + 10, seed=1)
    assert len(kept) == len(own) + 10
    assert kept[:len(own)] == sorted(own, key=IDENTITY)
    assert sorted(capped(examples, "warptile", limit=10**6), key=IDENTITY) == sorted(
        examples, key=IDENTITY)
    # which examples are kept, and in what order, never depends on the order they came in
    shuffled = random.Random(7).sample(examples, len(examples))
    for limit in (5, len(own) + 10, 10**6):
        assert capped(shuffled, "warptile", limit=limit, seed=1) == capped(
            examples, "warptile", limit=limit, seed=1)
    assert capped(examples, "warptile", limit=5, seed=1) != capped(examples, "warptile",
                                                                   limit=5, seed=2)


def test_a_capped_fit_reads_each_units_best_and_its_neighbours_from_all_examples(
        pinned, monkeypatch):
    """The cap thins a fit's rows, not what they are measured against: each kept example's
    row (its transfer columns: what its config measured at the nearest other shape) and its
    label (its fraction of its unit's best) are those the uncapped fit gives it. A sample of a
    unit may lack its best, and a sample of a neighbour the config."""
    import tuner.search.learned as learned

    examples = examples_from_recordings(pinned)
    limit = len(examples) // 3
    monkeypatch.setattr(learned, "MAX_EXAMPLES", limit)
    uncapped = CostModel(0)
    uncapped.add_examples(examples)
    # (an H200 unit's rows can equal an H100 one's: same SM count and arch, other labels)
    labelled = {(row.tobytes(), y) for rows, ys in zip(uncapped._rows, uncapped._targets)
                for row, y in zip(rows, ys)}
    model = learned.offline_model(examples, "warptile", seed=3)
    assert 0 < model.rows <= limit
    rows = np.concatenate(model._rows)
    assert np.isfinite(rows[:, TRANSFER_COLUMNS]).any()
    assert all((row.tobytes(), y) in labelled
               for row, y in zip(rows, np.concatenate(model._targets)))


def test_hybrid_picks_come_from_the_model_only_when_it_learned_the_family_elsewhere(pinned):
    family = kernels.FAMILIES["tf32x3"]
    problem = Problem(3000, 3000, 3000)
    examples = [e for e in examples_from_recordings(pinned) if e.problem != problem]
    accepted = family.accepted_configs("sm_90")[:3000]
    positions = [dict(c) for c in accepted]
    learned = LearnedSpace.build(family, accepted, positions, problem, H100, examples)
    picks = model_picks(learned, "tf32x3", 3, seed=0)
    assert len(picks) == 3 and all(p in positions for p in picks)
    assert len({tuple(sorted(p.items())) for p in picks}) == 3
    assert picks == model_picks(learned, "tf32x3", 3, seed=0)  # deterministic
    others = LearnedSpace.build(family, accepted, positions, problem, H100,
                                [e for e in examples if e.family != "tf32x3"])
    assert model_picks(others, "tf32x3", 3, seed=0) == []


def _first_window_groups(tmp_path: Path, recordings, name: str) -> list[int]:
    """A replayed model-sampler study of warptile with 17 candidates in flight (the H100 host's
    window), learning from the other recordings: how many of the first window's configs fall
    in each geometry group, largest first."""
    from collections import Counter

    from tuner.search.learned import problem_held_out
    from tuner.search.prior import geometry

    recording = next(r for r in recordings if ("warptile", Problem(1024, 1024, 1024)) in r.pairs())
    problem = Problem(1024, 1024, 1024)
    gpu = str(recording.gpu["name"])
    database = db.open_database(f"sqlite:///{tmp_path / name}")
    replay = ReplayEvaluator(recording)
    session = Session(database=database, evaluator=replay,
                      storage=optuna.storages.InMemoryStorage(),
                      gpu_id=database.ensure_gpu(db.GpuInfo(**replay.info())), gpu_name=gpu,
                      sampler="model", seed=0, batch=17, warm_start=False, progress=False,
                      training=examples_from_recordings(
                          recordings, problem_held_out(gpu, problem.shape)))
    family = replay.family(kernels.get_family("warptile"))
    outcome = run_study(session, family, problem, Budget(trials=17, timeout_s=None,
                                                         patience=None))
    first = [t.params for t in database.run_history(outcome.run_id) if t.state != "rejected"]
    database.close()
    assert len(first) == 17
    groups = Counter(geometry(family, c, problem.m, problem.n, problem.k).key() for c in first)
    return sorted(groups.values(), reverse=True)


def test_the_model_sampler_spreads_a_window_over_geometry_groups(tmp_path, pinned, monkeypatch):
    """Asked 17 times before any result, the model sampler keeps at most PENDING_PER_GROUP
    configs of one geometry group waiting (a model wrong about one geometry would otherwise
    spend the whole window on it); without the rule its top 17 crowd fewer groups."""
    from tuner.search import learned

    per_group = learned.PENDING_PER_GROUP
    spread = _first_window_groups(tmp_path, pinned, "spread.sqlite")
    assert max(spread) <= per_group and len(spread) >= 17 // per_group, spread
    monkeypatch.setattr(learned, "PENDING_PER_GROUP", 17)  # the rule off
    crowded = _first_window_groups(tmp_path, pinned, "crowded.sqlite")
    assert max(crowded) > per_group, crowded


def _vectorized_model_study(background: bool = False, problem: Problem = Problem(2048, 2048, 2048),
                            examples: Sequence[Any] = (), seed: int = 0
                            ) -> tuple[optuna.Study, Any]:
    """A study of vectorized's accepted configs (4,192) with the model sampler, learning from
    ``examples`` (default: none, a cold database), and its distributions; the sampler's
    ``learned.configs`` are the configs' positions."""
    from tuner.search import space
    from tuner.search.samplers import SearchSpace, make_sampler
    from tuner.search.study import _accepted_configs

    family = kernels.get_family("vectorized")
    accepted = _accepted_configs(family, "sm_90")
    learned = LearnedSpace.build(family, accepted, space.params_from_configs(family, accepted),
                                 problem, Target(132, "sm_90"), list(examples))
    distributions = space.distributions(family)
    sampler = make_sampler("model", seed, SearchSpace(
        distributions, space.feasibility(family, "sm_90"), learned=learned),
        background=background)
    return optuna.create_study(direction="maximize", sampler=sampler), distributions


def _h100_examples(recordings: Sequence[Any]) -> list[Any]:
    return [e for e in examples_from_recordings(recordings) if e.gpu.startswith("NVIDIA H100")]


def test_the_model_samplers_ask_does_not_walk_every_accepted_config(monkeypatch):
    """An ask marks the configs already asked for through the trials (a handful), not by a key
    per accepted config (tens of thousands: ~0.1 s of the tuner's main thread per ask with the
    GPU waiting); it still never proposes a config twice."""
    from tuner.search import learned as learned_module

    study, distributions = _vectorized_model_study()
    assert len(study.sampler.learned.configs) > 2000
    keys = 0
    real = learned_module._key

    def counted(*args):
        nonlocal keys
        keys += 1
        return real(*args)

    monkeypatch.setattr(learned_module, "_key", counted)
    asked = set()
    for number in range(12):  # past the own start-up: the model is fitted and ranks
        trial = study.ask(distributions)
        asked.add(tuple(sorted(trial.params.items())))
        study.tell(trial, float(number % 5))
    assert len(asked) == 12  # never the same config twice
    assert keys < 12 * 30, keys  # the trials', not 2,000 per ask


def _fit_thread_idle() -> None:
    """Wait for the fit thread's queue to empty: a refit an earlier test left running would
    otherwise call this test's patched fit (one thread serves every study of the process)."""
    from tuner.search import learned as learned_module

    learned_module._fit_thread().submit(lambda: None).result(timeout=60)


def _hold_fits(monkeypatch, held_from: int
               ) -> tuple[list[str], threading.Event, threading.Event]:
    """Patch the model's fit: each records the thread it runs on, and from the ``held_from``-th
    on, each sets ``began`` and waits (20 s at most) until the test sets ``gate``. Returns the
    threads' names, ``began`` and ``gate``."""
    from tuner.search import costmodel

    fitted_on: list[str] = []
    began, gate = threading.Event(), threading.Event()
    real = costmodel.CostModel.fit

    def held(model):
        fitted_on.append(threading.current_thread().name)
        if len(fitted_on) >= held_from:
            began.set()
            gate.wait(timeout=20)
        return real(model)

    monkeypatch.setattr(costmodel.CostModel, "fit", held)
    return fitted_on, began, gate


def test_a_live_studys_model_refits_on_a_thread_while_it_goes_on_asking(monkeypatch):
    """With an asynchronous evaluator (the GPU measures while the study asks) the model's
    refits after the first run on a thread: the asks go on with the scores they have, and take
    the new ones once the refit is done. The first fit (no scores yet) stays on the caller."""
    _fit_thread_idle()
    study, distributions = _vectorized_model_study(background=True)
    sampler = study.sampler
    fitted_on, refit_began, gate = _hold_fits(monkeypatch, held_from=2)
    for number in range(20):
        trial = study.ask(distributions)
        study.tell(trial, float(number % 7))
    # The refit is submitted during the asks; on a loaded machine its thread may start later.
    assert refit_began.wait(timeout=20)
    assert fitted_on[0] == threading.current_thread().name  # the first: synchronous
    assert len(fitted_on) == 2 and fitted_on[1].startswith("costmodel-fit")  # one at a time
    assert sampler.fits == 1 and not gate.is_set()  # 20 asks made while it waited
    gate.set()
    sampler._fitting.result(timeout=20)
    study.tell(study.ask(distributions), 1.0)
    assert sampler.fits >= 2  # its scores taken at the next ask


def test_a_live_study_is_told_to_hold_its_asks_while_its_first_fit_runs_on_a_thread(monkeypatch):
    """The first fit of a study's own measurements (after the static prior's start-up, no scores
    yet) would hold the main thread with the GPU idle: ``holds_asks`` begins it on the fit
    thread and says to ask nothing until it is done; the next ask then takes its scores without
    fitting on the caller. A replay's sampler (not in the background) never holds."""
    from tuner.search import learned as learned_module

    _fit_thread_idle()
    study, distributions = _vectorized_model_study(background=True)
    sampler = study.sampler
    fitted_on, started, gate = _hold_fits(monkeypatch, held_from=1)
    for number in range(learned_module.STARTUP_TRIALS):
        assert not sampler.holds_asks(study)  # the start-up's picks: no fit needed
        study.tell(study.ask(distributions), float(number + 1))
    assert sampler.holds_asks(study) and sampler.holds_asks(study)  # begun once, still running
    assert started.wait(timeout=20)
    assert len(fitted_on) == 1 and fitted_on[0].startswith("costmodel-fit")
    assert sampler.scores is None and sampler.fits == 0
    gate.set()
    sampler._fitting.result(timeout=20)
    assert not sampler.holds_asks(study)
    study.tell(study.ask(distributions), 1.0)
    assert sampler.fits == 1 and len(fitted_on) == 1  # its scores, taken at the ask

    replayed, distributions = _vectorized_model_study(background=False)
    for number in range(learned_module.STARTUP_TRIALS + 2):
        assert not replayed.sampler.holds_asks(replayed)
        replayed.tell(replayed.ask(distributions), float(number + 1))


def _background_refits(asks: int) -> int:
    """A model sampler refitting in the background over vectorized at 2048³: its fits."""
    study, distributions = _vectorized_model_study(background=True)
    sampler = study.sampler
    for number in range(asks):
        study.tell(study.ask(distributions), float(number % 7))
    if sampler._fitting is not None:
        sampler._fitting.result(timeout=60)
    study.tell(study.ask(distributions), 1.0)
    return sampler.fits


def _refit_in_child(done: Any) -> None:
    done.put(_background_refits(30))


def test_a_process_forked_after_background_refits_can_refit_too():
    """The benchmark's worker pools fork the process that ran studies before (the test suite's
    own, here): a refit in the child must neither hang on the parent's fit thread (not copied
    by a fork) nor on OpenMP worker threads (libgomp's pool does not survive a fork: a
    prediction on several threads before the fork hung the child's first one)."""
    import multiprocessing

    assert _background_refits(30) >= 2
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    child = context.Process(target=_refit_in_child, args=(done,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung in its refits")
    assert child.exitcode == 0 and done.get(timeout=5) >= 2


def test_a_live_study_learns_from_the_bundled_recordings_of_its_gpu_model_except_its_shape(
        tmp_path):
    """The examples a live study's model learns from (``examples_for_study``) include the
    bundled recordings of the study's GPU model, and none of its own shape: what the benchmark's
    leave-one-out rows measured (bench/search_efficiency.py)."""
    database = db.open_database(f"sqlite:///{tmp_path / 'empty.sqlite'}")
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    cube = Problem(3000, 3000, 3000)  # tf32x3 and pipelined are recorded there on the H100
    units = {e.unit for e in examples_for_study(database, h100, cube, recordings=True)}
    assert (h100, "tf32x3", "256x256x16384") in units and (h100, "splitk", "512x384x8192") in units
    assert not any(shape == cube.shape for _, _, shape in units)
    assert {gpu for gpu, _, _ in units} == {h100}
    h200_units = {e.unit for e in examples_for_study(database, h200, cube, recordings=True)}
    assert h200_units and {gpu for gpu, _, _ in h200_units} == {h200}
    assert examples_for_study(database, h100, cube, recordings=False) == []
    assert examples_for_study(database, "NVIDIA A100-SXM4-80GB", cube, recordings=True) == []
    database.close()


def test_first_picks_are_the_model_samplers_first_asks(monkeypatch, pinned):
    """What the prefetch compiles ahead (``first_picks``) is what the sampler's first asks take
    with nothing measured: its best scores, spread over geometry groups (uniform asks off)."""
    from tuner.search import learned as learned_module
    from tuner.search.learned import first_picks

    monkeypatch.setattr(learned_module, "EPSILON", 0.0)
    monkeypatch.setattr(learned_module, "PENDING_PER_GROUP", 1)  # groups fill in the window
    study, distributions = _vectorized_model_study(  # a shape no recording holds
        problem=Problem(1536, 1792, 2048), examples=_h100_examples(pinned), seed=3)
    sampler = study.sampler
    learned, positions = sampler.learned, sampler.learned.configs
    asked = [study.ask(distributions).params for _ in range(40)]  # none told
    assert sampler.scores is not None
    picks = first_picks(learned.x, sampler.scores, 40)
    assert asked == [positions[row] for row in picks]
    group = learned_module.geometry_groups(learned.x)
    best = np.argsort(-sampler.scores, kind="stable")[:40]
    assert max(np.unique(group[best], return_counts=True)[1]) > 1  # the spread has work to do
    assert max(np.unique(group[picks], return_counts=True)[1]) == 1


def test_upcoming_foresees_the_model_samplers_next_asks(monkeypatch, pinned):
    """What a live study compiles ahead (``ModelSampler.upcoming``) is what the next asks take
    while no result comes back (uniform asks off): the scores, the window's geometry groups
    and the configs in flight as the asks will see them; foreseeing them draws nothing from
    the sampler's rng and refits nothing."""
    from tuner.search import learned as learned_module

    monkeypatch.setattr(learned_module, "EPSILON", 0.0)
    monkeypatch.setattr(learned_module, "PENDING_PER_GROUP", 1)  # groups fill in the window
    study, distributions = _vectorized_model_study(  # a shape no recording holds
        problem=Problem(1536, 1792, 2048), examples=_h100_examples(pinned), seed=5)
    sampler, positions = study.sampler, study.sampler.learned.configs
    for number in range(12):  # measured: refitted on its own results since
        study.tell(study.ask(distributions), float(1 + number % 5))
    held = [study.ask(distributions) for _ in range(10)]  # in flight, no result yet
    state, fits = sampler.rng.getstate(), sampler.fits
    foreseen = sampler.upcoming(study, 12)
    assert sampler.rng.getstate() == state and sampler.fits == fits
    asked = [study.ask(distributions).params for _ in range(12)]
    assert asked == [positions[row] for row in foreseen]
    assert not {tuple(sorted(t.params.items())) for t in held} & {
        tuple(sorted(p.items())) for p in asked}


def test_own_measurements_correct_the_examples_fit_where_those_hold_the_family(
        monkeypatch, pinned):
    """Where the examples hold the family at other shapes, the examples' two models (with and
    without the nearest-shape columns) are fitted once, and the study's own results enter as a
    correction, fitted on them alone (deterministic with a fixed seed), of the one whose order
    they agree with: a config measured far below its prediction loses score, one measured
    above gains."""
    from tuner.search import costmodel

    fits = []
    real = costmodel.CostModel.fit
    monkeypatch.setattr(costmodel.CostModel, "fit", lambda model: fits.append(1) or real(model))
    runs = []
    for _ in range(2):
        study, distributions = _vectorized_model_study(
            problem=Problem(1536, 1792, 2048), examples=_h100_examples(pinned), seed=3)
        sampler = study.sampler
        assert sampler.correcting
        told = []
        for number in range(14):
            trial = study.ask(distributions)
            row = sampler.index[tuple(int(trial.params[n]) for n in sampler.names)]
            value = 100.0 if number % 2 else 10.0  # every other one far slower than the rest
            study.tell(trial, value)
            told.append((row, value))
        study.tell(study.ask(distributions), 50.0)  # the refit after the last of those
        rows = [r for r, _ in told]
        base = sampler._bases.trusted(rows, np.array([v for _, v in told]))
        assert base is not None  # 14 own results tell the two apart
        runs.append((sampler.scores.copy(), base, told))
    assert len(fits) == 4  # two fits of the examples per study, however many refits
    (scores, base, told), (again, _, told_again) = runs
    assert told == told_again and np.array_equal(scores, again)
    slow = [r for r, v in told if v == 10.0]
    fast = [r for r, v in told if v == 100.0]
    assert np.mean(scores[slow] - base[slow]) < min(0.0, np.mean(scores[fast] - base[fast]))


def _example(problem: Problem, config: dict[str, int], gflops: float, gpu: str = "H100",
             target: Target = H100, family: str = "warptile") -> Example:
    return Example(gpu, target, family, config, problem, gflops)


def test_transfer_reads_the_nearest_other_shape_that_measured_each_config():
    """A config's transfer columns: its fraction of the best at the nearest other shape of the
    family that measured it, that shape's distance, and its best fraction at any other shape
    of the family; never its own unit's, never the searched shape's, never another target's;
    NaN where no other shape measured it."""
    family = kernels.FAMILIES["warptile"]
    a, b, c, d = (dict(config) for config in family.accepted_configs()[:4])
    near, mid, far = Problem(1024, 1024, 1024), Problem(2048, 2048, 2048), Problem(4096, 1024, 1024)
    examples = [_example(near, a, 50.0), _example(near, b, 100.0),
                _example(mid, a, 80.0), _example(mid, b, 40.0),
                _example(far, c, 30.0),
                _example(far, d, 60.0, gpu="A100", target=Target(108, "sm_80"))]
    transfer = Transfer(examples)
    searched = Problem(1100, 1000, 1024)
    configs = [a, b, c, d]
    x = transfer.fill(matrix(family, configs, searched, H100), "warptile", configs, searched, H100)
    rate, distance, best = (x[:, FEATURES.index(name)] for name in TRANSFER_FEATURES)
    assert rate[:2].tolist() == [0.5, 1.0]  # from the nearest shape, normalised by its best
    assert distance[0] == pytest.approx(shape_distance(searched, near))
    assert rate[2] == 1.0 and distance[2] == pytest.approx(shape_distance(searched, far))
    assert best[:3].tolist() == [1.0, 1.0, 1.0]  # a's best is the farther shape's
    assert np.isnan(x[3, TRANSFER_COLUMNS]).all()  # only another target measured it
    # a training unit's own rows read the other units only
    own = transfer.fill(matrix(family, [a, b], near, H100), "warptile", [a, b], near, H100,
                        own=("H100", "warptile", near.shape))
    assert own[:, FEATURES.index("near_rate")].tolist() == [1.0, 0.5]
    assert own[:, FEATURES.index("best_rate")].tolist() == [1.0, 0.5]
    # the searched shape's own measurements (of another GPU model) are never read
    same = transfer.fill(matrix(family, [a], mid, H100), "warptile", [a], mid, H100)
    assert same[0, FEATURES.index("near_rate")] == 0.5
    # matrix leaves the columns unset until filled
    assert np.isnan(matrix(family, [a], mid, H100)[:, TRANSFER_COLUMNS]).all()


def test_the_examples_fit_is_larger_where_they_hold_the_family_at_many_shapes():
    """LARGE_ROUNDS from LARGE_FROM_SHAPES (GPU model, shape) units of the searched family on,
    for LARGE_FAMILIES only; other families' shapes do not count; the copies the two fits are
    made from keep the size."""
    assert {"pipelined", "splitk", "skinny"} == LARGE_FAMILIES
    family = kernels.FAMILIES["pipelined"]
    config = dict(family.accepted_configs()[0])
    shapes = [Problem(512 * i, 1024, 1024) for i in range(1, LARGE_FROM_SHAPES + 1)]
    few = [_example(p, config, 10.0, family="pipelined") for p in shapes[:-1]]
    assert offline_model(few, "pipelined", 0).rounds == MAX_ITER
    assert offline_model(few, "splitk", 0).rounds == MAX_ITER  # none of that family
    many = few + [_example(shapes[-1], config, 10.0, family="pipelined")]
    model = offline_model(many, "pipelined", 0)
    assert model.rounds == LARGE_ROUNDS > MAX_ITER and model.rows == len(many)
    assert model.copy(ignored=TRANSFER_COLUMNS).rounds == LARGE_ROUNDS
    assert offline_model(many, "splitk", 0).rounds == MAX_ITER
    # the same shapes on another GPU model are other units
    split = few + [_example(shapes[0], config, 10.0, family="pipelined", gpu="A100",
                            target=Target(108, "sm_80"))]
    assert offline_model(split, "pipelined", 0).rounds == LARGE_ROUNDS
    # and the fit boosts that many rounds
    assert model.fit()._model.n_iter_ == LARGE_ROUNDS
    # a family outside LARGE_FAMILIES keeps the default, however many shapes
    tf32x3 = dict(kernels.FAMILIES["tf32x3"].accepted_configs()[0])
    held = [_example(p, tf32x3, 10.0, family="tf32x3") for p in shapes]
    assert offline_model(held, "tf32x3", 0).rounds == MAX_ITER


def test_a_searched_problems_own_measurements_never_reach_its_transfer_columns(recordings):
    """Leave-one-out through the transfer columns: the benchmark's training for a pair holds
    nothing of its shape, and the columns built from it read only other shapes."""
    bench = search_efficiency()
    path, recording = next((p, r) for p, r in zip(RECORDINGS, recordings)
                           if r.gpu["name"].startswith("NVIDIA H100") and "tf32x3" in r.families)
    gpu = recording.gpu["name"]
    family_name, problem = next(p for p in recording.pairs() if p[0] == "tf32x3")
    same = tuple(str(p) for p, r in zip(RECORDINGS, recordings) if r.gpu["name"] == gpu)
    training = bench.training_for(bench.Job(str(path), family_name, problem, "model",
                                            0, 10, same), gpu)
    family = kernels.get_family(family_name)
    configs = [dict(c) for c, r in recording.results(family_name, problem) if r.usable][:50]
    target = Target(recording.gpu["sm_count"], recording.arch)
    x = space_rows(family_name, matrix(family, configs, problem, target), configs, problem,
                   target, training)
    distance = x[:, FEATURES.index("near_distance")]
    assert np.isfinite(distance).any() and (distance[np.isfinite(distance)] > 0).all()


def test_a_fit_that_ignores_the_transfer_columns_is_the_fit_without_them(recordings):
    """``Bases.plain``: the same rows with the nearest-shape columns left out of the fit
    predict exactly what rows without those columns do (the fit without transfer columns,
    docs/search.md, "The fit")."""
    examples = [e for e in _h100_examples(recordings) if e.family == "tf32x3"]
    with_transfer = CostModel(0)
    with_transfer.add_examples(examples)
    x = np.concatenate(with_transfer._rows)
    assert np.isfinite(x[:, TRANSFER_COLUMNS]).any()  # the columns say something
    blank = x.copy()
    blank[:, TRANSFER_COLUMNS] = np.nan
    without = CostModel(0)
    without.add(blank, np.concatenate(with_transfer._targets))
    ignoring = with_transfer.copy(ignored=TRANSFER_COLUMNS).fit().predict(x)
    assert np.array_equal(ignoring, without.fit().predict(blank))
    assert not np.array_equal(ignoring, with_transfer.copy().fit().predict(x))


def test_the_two_fits_are_taken_in_turn_each_config_at_its_first_place():
    bases = Bases(transfer=np.array([0.9, 0.8, 0.1, 0.2, 0.3]),
                  plain=np.array([0.9, 0.1, 0.8, 0.7, 0.2]))
    order = np.argsort(-bases.alternated(), kind="stable").tolist()
    # transfer: 0 1 4 3 2; plain: 0 2 3 4 1; in turn: 0 0 1 2 4 3 ... → 0, 1, 2, 4, 3
    assert order == [0, 1, 2, 4, 3]
    bases = Bases(transfer=np.array([0.1, 0.2, 0.3, 0.4]), plain=np.array([0.4, 0.3, 0.2, 0.1]))
    assert np.argsort(-bases.alternated(), kind="stable").tolist() == [3, 0, 2, 1]
    # corrected scores take the bases' place (plain: 3 0 1 2)
    assert np.argsort(-bases.alternated(plain=np.array([0.0, 0.0, 0.0, 1.0])),
                      kind="stable").tolist() == [3, 2, 0, 1]
    assert np.argsort(-bases.alternated(transfer=np.array([1.0, 0.0, 0.0, 0.0])),
                      kind="stable").tolist() == [0, 1, 2, 3]


def test_breadth_first_takes_each_decomposition_s_next_config_in_turn():
    order = np.array([4, 0, 3, 1, 2, 5])
    parts = np.array([0, 1, 1, 0, 0, 2])  # config → part; in order: 0 0 0 1 1 2
    # firsts of the parts (in the order they first come): 4, 1, 5; then seconds: 0, 2; thirds: 3
    assert breadth_first(order, parts).tolist() == [4, 1, 5, 0, 2, 3]
    assert breadth_first(order, np.zeros(6, dtype=np.int64)).tolist() == order.tolist()


def test_the_first_window_reaches_a_decomposition_both_fits_rank_low():
    # both fits rank the four configs of part 0 first; part 1's best (config 4) is fifth
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    parts = np.array([0, 0, 0, 0, 1, 1])
    without = np.argsort(-Bases(scores, scores).alternated(), kind="stable").tolist()
    with_parts = np.argsort(-Bases(scores, scores, parts).alternated(), kind="stable").tolist()
    assert without == [0, 1, 2, 3, 4, 5]
    # the order (0 1 2 3 4 5) and its breadth-first regrouping (0 4 1 5 2 3) in turn:
    # 0 0 1 4 2 1 3 5 ... → part 1's best third instead of fifth
    assert with_parts == [0, 1, 4, 2, 3, 5]
    assert sorted(with_parts) == list(range(6))


def test_decompositions_group_configs_by_block_tile_and_split():
    recording = load(BUNDLED_RECORDINGS / "h100-splitk-288x576x13312+704x448x7168.json.gz")
    family, problem = next(iter(recording.pairs()))
    configs = [dict(c) for c, _ in recording.results(family, problem)]
    x = matrix(kernels.get_family(family), configs, problem, Target(132, "sm_90"))
    part = decompositions(x)
    key = [(c["BM"], c["BN"], c["SPLITK"]) for c in configs]
    assert len(set(part.tolist())) == len(set(key)) > 10
    for a in range(0, len(configs), 7):
        for b in range(0, len(configs), 11):
            assert (part[a] == part[b]) == (key[a] == key[b])


def test_own_results_trust_the_fit_whose_order_they_agree_with():
    rng = np.random.default_rng(0)
    own = rng.random(40)
    agrees, disagrees = own + 0.01 * rng.random(40), rng.random(40)
    rows = list(range(TRUST_AFTER))
    values = own[rows]
    assert Bases(agrees, disagrees).trusted(rows, values) is not None
    assert Bases(agrees, disagrees).trusted(rows, values) is agrees
    assert Bases(disagrees, agrees).trusted(rows, values) is agrees
    assert Bases(agrees, disagrees).trusted(rows[:-1], values[:-1]) is None  # too few yet
    assert Bases(agrees, agrees.copy()).trusted(rows, values) is None  # a tie tells nothing
    constant = np.full(40, 0.5)  # orders nothing: the other is trusted
    assert Bases(constant, disagrees).trusted(rows, values) is disagrees


def _fill_per_config(transfer: Transfer, x, family, configs, problem, target, own=None):
    """The transfer columns as the rule reads, config by config (the reference ``fill`` is
    checked against)."""
    out = np.array(x, dtype=np.float64, copy=True)
    out[:, TRANSFER_COLUMNS] = np.nan
    names = tuple(sorted(configs[0]))
    candidates = sorted(((shape_distance(problem, p), rates.get(names, {}))
                         for unit, p, rates in transfer._units.get((target, family), [])
                         if unit != own and p.shape != problem.shape), key=lambda item: item[0])
    for row, config in enumerate(configs):
        if any(n not in config for n in names):
            continue
        key = tuple(int(config[n]) for n in names)
        measured = [(d, rates[key]) for d, rates in candidates if key in rates]
        if measured:
            out[row, TRANSFER_COLUMNS] = (measured[0][1], measured[0][0], max(f for _, f in measured))
    return out


@pytest.mark.parametrize("family_name,shape", [("pipelined", (2048, 2048, 2048)), ("skinny", (16, 4096, 4096)),
                                               ("wgmma", (1024, 1024, 1024))])
def test_transfer_fill_matches_the_rule_config_by_config_on_the_bundled_recordings(family_name, shape):
    from tuner.measure.recording import bundled
    from tuner.search.learned import examples_from_recordings

    examples = examples_from_recordings(bundled("NVIDIA H100 80GB HBM3"))
    transfer = Transfer(examples)
    family = kernels.get_family(family_name)
    problem = Problem(*shape)
    configs = family.accepted_configs("sm_90")
    configs = configs + [dict(configs[0])] + [{"OTHER": 1}]  # a repeated config, and another family's
    target = next(e.target for e in examples if e.family == family_name)
    x = matrix(family, configs[:-1], problem, target)
    x = np.vstack([x, np.full((1, x.shape[1]), np.nan)])
    got = transfer.fill(x, family_name, configs, problem, target)
    want = _fill_per_config(transfer, x, family_name, configs, problem, target)
    assert np.array_equal(got, want, equal_nan=True)
    assert not np.isnan(got[:, TRANSFER_COLUMNS[0]]).all()  # some configs were measured elsewhere
    unit = next(e.unit for e in examples if e.family == family_name)  # a training unit's own rows
    assert np.array_equal(transfer.fill(x, family_name, configs, problem, target, own=unit),
                          _fill_per_config(transfer, x, family_name, configs, problem, target, own=unit),
                          equal_nan=True)


def test_a_fits_key_counts_each_units_examples():
    """``fit_key``: the seed and each unit's example count, sorted; problems of one shape in
    two layouts are one unit (a unit names the shape only)."""
    from collections import Counter

    from tuner.search.learned import examples_from_recordings, fit_key

    recorded = examples_from_recordings([load(BUNDLED_RECORDINGS / "h100-pipelined-1023x1025x999.json.gz"),
                                         load(BUNDLED_RECORDINGS / "h200-tf32x3-256x256x16384.json.gz")])
    first = recorded[0]
    transposed = Example(first.gpu, first.target, first.family, first.config,
                         Problem(first.problem.m, first.problem.n, first.problem.k, layout="nt"), 1.0)
    examples = recorded + [transposed]
    seed, counts = fit_key(3, examples)
    assert counts == tuple(sorted(Counter(e.unit for e in examples).items()))
    assert dict(counts)[first.unit] == sum(e.unit == first.unit for e in recorded) + 1
    assert seed == CostModel(3).seed


@pytest.mark.parametrize("names", [[], ["BM"], ["BM", "BN", "STAGES"]])
def test_the_samplers_index_keys_are_each_configs_key(names):
    from tuner.search import space
    from tuner.search.learned import _key, _keys

    family = kernels.get_family("tf32x3")
    positions = space.params_from_configs(family, family.sample_accepted(50, seed=1))
    assert _keys(positions, names) == [_key(p, names) for p in positions]
