"""A shape's fastest configs timed again at its end (tuner.run.retime): real SQLite, real
families, the analytic stand-in evaluator in place of a GPU (its clock can be made to drift)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import db
import kernels
import optuna
import pytest

from tuner.measure.evaluator import Baseline
from tuner.measure.testing import StandInEvaluator, model_gflops
from tuner.problem import Problem
from tuner.run.retime import RETIME_BAND, configs_of, top
from tuner.run.session import Summary
from tuner.search.study import Session, StudyOutcome

NAIVE = kernels.FAMILIES["naive"]
BLOCKTILE1D = kernels.FAMILIES["blocktile1d"]
P = Problem(1024, 1024, 1024)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def database(tmp_path):
    with db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}") as opened:
        yield opened


def close_pair(family) -> tuple[dict[str, int], dict[str, int]]:
    """Two accepted configs whose stand-in rates differ by under 3 %, slower one first."""
    configs = sorted(family.accepted_configs(),
                     key=lambda c: model_gflops(family, c, P))
    for slow, fast in zip(configs, configs[1:]):
        if 1.0 < model_gflops(family, fast, P) / model_gflops(family, slow, P) < 1.03:
            return slow, fast
    raise AssertionError("no two configs that close")


def stored_study(database, session: Session, family, timed: list[tuple[dict[str, int], float]]
                 ) -> StudyOutcome:
    """A finished run of ``family`` at P whose trials read these GFLOP/s, as a study stores them."""
    run = database.start_run(
        gpu_id=session.gpu_id, problem_id=database.ensure_problem(P.m, P.n, P.k),
        family_id=database.ensure_family(family.name, family.source_hash), sampler="default",
        seed=0, budget={}, host="test", command="test", study_name=f"{family.name} test")
    for number, (config, gflops) in enumerate(timed):
        database.add_trial(run, db.TrialRecord(number=number, params=config, state="ok",
                                               time_median_ms=2 * P.m * P.n * P.k / gflops / 1e6,
                                               gflops=gflops, sm_clock_mhz=1980, launches=10))
    database.finish_run(run, "finished")
    best = max(range(len(timed)), key=lambda i: timed[i][1])
    return StudyOutcome(f"{family.name} test", run, "finished", "trial budget", len(timed),
                        len(timed), timed[best][0], timed[best][1], best)


def session_on(database, evaluator: StandInEvaluator, rounds: int = 3) -> Session:
    info = evaluator.info()
    return Session(database=database, evaluator=evaluator, storage=None,
                   gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                   progress=False, retime_rounds=rounds)


def test_a_lucky_first_timing_loses_the_pick_once_re_timed(database):
    """naive's slower config was timed 4 % high (a cool GPU at the study's start): the study's
    best. Re-timed in three rounds at one clock, its median is its real rate, the faster config
    takes the shape, and the database serves it; the config far below is left alone."""
    slow, fast = close_pair(NAIVE)
    far = min(NAIVE.accepted_configs(),
              key=lambda c: model_gflops(NAIVE, c, P))
    rate = {key: model_gflops(NAIVE, c, P) for key, c in (("slow", slow), ("fast", fast), ("far", far))}
    assert rate["far"] < rate["fast"] * (1 - RETIME_BAND)
    evaluator = StandInEvaluator()
    session = session_on(database, evaluator)
    outcome = stored_study(database, session, NAIVE,
                           [(slow, rate["slow"] * 1.04), (far, rate["far"]), (fast, rate["fast"])])
    summary = Summary([(P, NAIVE, outcome)])
    assert summary.best(P)[1].best_config == slow

    summary.settle(session, P)

    assert sorted(map(str, (c for _, c, _ in evaluator.calls))) == sorted(map(str, [slow, fast] * 3))
    family, settled = summary.best(P)
    assert settled.best_config == fast and settled.best_gflops == pytest.approx(rate["fast"])
    trials = {str(t.params): t for t in database.run_history(outcome.run_id)}
    assert trials[str(slow)].gflops == pytest.approx(rate["slow"]) and trials[str(slow)].timings == 4
    assert trials[str(far)].timings == 1
    served = database.best(session.gpu_name, P.m, P.n, P.k, nearest=False)
    assert served.params == fast and served.timings == 4
    assert "timed 3 more times in shuffled rounds" in summary.table()


def test_the_pick_between_families_is_made_at_one_clock(database):
    """blocktile1d's config was timed while the GPU throttled to 90 %, naive's and cuBLAS's at
    full clock: naive's read faster. Re-timed in shuffled rounds (all at 90 % now), blocktile1d's
    is the faster and takes the shape; both families' figures, and cuBLAS's, now read at that one
    clock, and the shape's newest baseline is cuBLAS's median."""
    rates = [(model_gflops(BLOCKTILE1D, b, P) / model_gflops(NAIVE, a, P), a, b)
             for a in NAIVE.accepted_configs() for b in BLOCKTILE1D.accepted_configs()]
    # within the band as timed (0.9 × its rate ≥ 95 % of naive's), faster at one clock
    _, naive_config, blocktile1d_config = min((r for r in rates if 0.95 / 0.9 < r[0] < 1 / 0.9),
                                              key=lambda r: r[0])
    naive_rate, blocktile1d_rate = model_gflops(NAIVE, naive_config, P), model_gflops(BLOCKTILE1D, blocktile1d_config, P)
    evaluator = StandInEvaluator(clock=lambda call: 0.9)
    evaluator.set_problem(P)
    session = session_on(database, evaluator)
    summary = Summary([
        (P, NAIVE, stored_study(database, session, NAIVE, [(naive_config, naive_rate)])),
        (P, BLOCKTILE1D, stored_study(database, session, BLOCKTILE1D, [(blocktile1d_config, blocktile1d_rate * 0.9)]))])
    summary.baselines[P] = Baseline("cublas", 1.0, 18_000.0, 1980)  # timed before the studies
    assert summary.best(P)[0] is NAIVE
    summary.settle(session, P)
    family, outcome = summary.best(P)
    assert family is BLOCKTILE1D and outcome.best_gflops == pytest.approx(blocktile1d_rate * 0.9)
    assert summary.outcomes[0][2].best_gflops == pytest.approx(naive_rate * 0.9)
    assert summary.baselines[P].gflops == pytest.approx(18_000.0 * 0.9) and len(evaluator.baselines) == 3
    problem_id = database.ensure_problem(P.m, P.n, P.k)
    assert database.latest_baseline(session.gpu_id, problem_id).gflops == pytest.approx(16_200.0)
    assert f"{blocktile1d_rate * 0.9 / 16_200.0:.2f}" in summary.table()


def test_nothing_is_re_timed_where_no_two_configs_are_close_or_rounds_are_off(database):
    slow, fast = close_pair(NAIVE)
    evaluator = StandInEvaluator()
    session = session_on(database, evaluator, rounds=0)
    outcome = stored_study(database, session, NAIVE, [(slow, 1000.0), (fast, 1010.0)])
    Summary([(P, NAIVE, outcome)]).settle(session, P)
    alone = stored_study(database, session_on(database, evaluator), NAIVE, [(slow, 1000.0), (fast, 500.0)])
    Summary([(P, NAIVE, alone)]).settle(session_on(database, evaluator), P)
    assert evaluator.calls == []
    assert all(t.timings == 1 for run in (outcome.run_id, alone.run_id) for t in database.run_history(run))


def test_a_config_timed_once_above_the_re_timed_medians_is_timed_too(database):
    """The search timed three configs at a cool moment, 16-20 % above what they run at. The
    first pass times the two within 5 % of the fastest: their medians fall under the third
    config's one timing. The next pass times that one with the fastest; the fastest takes the
    shape, and every config above the rest is re-timed."""
    rates: dict[float, dict[str, int]] = {}
    for config in BLOCKTILE1D.accepted_configs():
        rates.setdefault(model_gflops(BLOCKTILE1D, config, P), config)
    (a_rate, a), (b_rate, b), (c_rate, c) = sorted(rates.items(), key=lambda rc: -rc[0])[:3]
    evaluator = StandInEvaluator()
    session = session_on(database, evaluator)
    first = 1.2 * a_rate
    outcome = stored_study(database, session, BLOCKTILE1D, [(c, 0.92 * first), (a, first), (b, 0.97 * first)])
    assert 0.92 * first > a_rate > b_rate > c_rate  # the third's one timing above the others' real rates
    summary = Summary([(P, BLOCKTILE1D, outcome)])

    summary.settle(session, P)

    assert summary.best(P)[1].best_config == a
    trials = {str(t.params): t for t in database.run_history(outcome.run_id)}
    assert [trials[str(config)].timings for config in (a, b, c)] == [7, 4, 4]
    assert [trials[str(config)].gflops for config in (a, b, c)] == pytest.approx([a_rate, b_rate, c_rate])
    assert database.best(session.gpu_name, P.m, P.n, P.k, nearest=False).params == a


def test_the_fastest_are_one_per_config_within_the_band_and_at_most_four():
    def trial(params: dict[str, int], gflops: float, state: str = "ok"):
        return db.Trial(id=0, run_id=1, number=0, params=params, state=state, error=None,
                        compile_seconds=None, registers=None, shared_bytes=None, spill_bytes=None,
                        occupancy=None, time_min_ms=None, time_median_ms=1.0, time_max_ms=None,
                        launches=None, gflops=gflops, sm_clock_mhz=None, started_at=None,
                        recorded_at=None)  # type: ignore[arg-type]

    trials = [("a", trial({"X": 1}, 99.0)), ("a", trial({"X": 1}, 100.0)), ("b", trial({"X": 1}, 98.0)),
              ("a", trial({"X": 2}, 96.0)), ("a", trial({"X": 3}, 94.0)), ("a", trial({"X": 4}, 99.5, "wrong_result")),
              ("a", trial({"X": 5}, 97.0)), ("a", trial({"X": 6}, 96.5))]
    configs = configs_of(trials)
    assert len(configs) == 6 and configs[0].trial.gflops == 100.0  # a's X=1: its fastest trial
    assert [(c.family, c.trial.params["X"]) for c in top(configs)] == [("a", 1), ("b", 1), ("a", 5), ("a", 6)]
    assert top([]) == [] and [c.trial.params["X"] for c in top(configs[-1:])] == [3]


def test_the_command_re_times_and_says_so_and_a_replay_does_not(tmp_path):
    """python -m tuner on the stand-in GPU child (real NVRTC compiles): the trials within 5 %
    of the shape's best (4 at most) hold four timings and the table says what its figures are;
    --retime-rounds 0, and a replay of a recording, leave every trial one timing."""
    env = {**os.environ, "GEMMTUNE_GPU_BACKEND": "tuner.testing", "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "GEMMTUNE_DB": "", "GEMMTUNE_STORAGE": "",
           "GEMMTUNE_CACHE": ""}

    def run(url: str, *argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "tuner", "--db", url, *argv],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        return done

    def trials(url: str) -> list[db.Trial]:
        with db.open_database(url) as database:
            return [t for run in database.list_runs() for t in database.run_history(run.id)]

    # all 48 of naive's configs (patience off: which ones a study stopping early measured
    # varied), two of them within 5 % of the best on the stand-in child
    live = ["--kernel", "naive", "--shape", "96x64x32", "--workers", "2", "--trials", "48",
            "--patience", "0"]
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    done = run(url, *live)
    stored = trials(url)
    best = max(t.gflops or 0.0 for t in stored)
    first = [t for t in stored if t.timings == 1 and t.gflops]  # the stand-in child's timings
    near = [t for t in stored if t.timings == 4 or (t.gflops or 0) >= best * (1 - RETIME_BAND)]
    assert len(near) >= 2, "this shape's stand-in rates leave nothing to re-time"
    assert sum(t.timings == 4 for t in stored) == min(4, len(near)) and first
    assert "timed 3 more times in shuffled rounds" in done.stdout
    off = f"sqlite:///{tmp_path / 'b.sqlite'}"
    done = run(off, *live, "--retime-rounds", "0")
    assert "shuffled rounds" not in done.stdout and {t.timings for t in trials(off)} == {1}
    replayed = f"sqlite:///{tmp_path / 'c.sqlite'}"
    done = run(replayed, "--trials", "16",
               "--replay", str(ROOT / "tuner/recordings/h100-pipelined-1023x1025x999.json.gz"))
    assert "shuffled rounds" not in done.stdout and {t.timings for t in trials(replayed)} == {1}


optuna.logging.set_verbosity(optuna.logging.WARNING)
