"""Issue 19 on CPU: the phase accounting covers the search loop, asynchronous GPU requests record
the same measurements as blocking ones, and bench/throughput.py runs end to end — all on the
stand-in GPU child (tuner.measure.testing) with real NVRTC compiles. No speed is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import db
import kernels
import optuna
import pytest
from bench_support import bench_module

from tuner.measure.live import LiveEvaluator, default_workers
from tuner.problem import Problem
from tuner.search.study import Budget, Session, run_study

ROOT = Path(__file__).resolve().parents[1]
NAIVE = kernels.get_family("naive")
SMALL = Problem(64, 48, 32)
MEASURE_S = 0.05  # each stand-in evaluation sleeps this long, as a GPU would be busy


def live(tmp_path: Path, queue_depth: int, measure_s: float = 0.0) -> LiveEvaluator:
    return LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1, queue_depth=queue_depth,
                         backend="tuner.testing", backend_options={"measure_s": measure_s})


def study(evaluator: LiveEvaluator, folder: Path, trials: int) -> tuple[dict, Session]:
    """A random-sampler study of naive on SMALL: {config: the stored result fields}."""
    folder.mkdir(exist_ok=True)
    session = standin_session(evaluator, folder, evaluator.batch, phases=evaluator.phases)
    database = session.database
    outcome = run_study(session, NAIVE, SMALL, Budget(trials=trials, timeout_s=120,
                                                      patience=None))
    measured = {tuple(sorted(t.params.items())): (t.state, t.gflops, t.time_median_ms,
                                                   t.launches, t.sm_clock_mhz, t.registers)
                for t in database.run_history(outcome.run_id) if t.state != "rejected"}
    database.close()
    return measured, session


def test_compile_workers_take_the_cores_left_and_the_window_runs_ahead_of_them(tmp_path):
    assert default_workers(16) == 14 and default_workers(2) == 1 and default_workers(1) == 1
    with LiveEvaluator(0, cache_dir=tmp_path, workers=3, backend="tuner.testing") as evaluator:
        assert evaluator.batch == 3 + evaluator.queue_depth >= evaluator.pool.workers


def test_queued_requests_record_what_blocking_requests_record(tmp_path):
    """The stand-in child's answer is a function of the CUBIN (deterministic), so a study with
    one blocking request at a time and one with two queued store the same results."""
    with live(tmp_path, queue_depth=1) as blocking:
        before, _ = study(blocking, tmp_path / "blocking", trials=8)
        config = dict(next(iter(before)))
        alone = blocking.evaluate(NAIVE, config, SMALL)
    with live(tmp_path, queue_depth=2) as queued:
        after, _ = study(queued, tmp_path / "queued", trials=8)
    common = before.keys() & after.keys()
    assert len(common) >= 4  # the seeded random sampler proposes the same configs either way
    assert {key: before[key] for key in common} == {key: after[key] for key in common}
    assert before[tuple(sorted(config.items()))][1:3] == (alone.gflops, alone.time_median_ms)


def standin_session(evaluator, folder: Path, batch: int, **fields) -> Session:
    """A random-sampler session on a stand-in evaluator (in-process, or the live path's
    stand-in GPU child), its database in folder."""
    database = db.open_database(f"sqlite:///{folder / 'gemmtune.sqlite'}")
    info = evaluator.info()
    return Session(database=database, evaluator=evaluator,
                   storage=optuna.storages.RDBStorage(database.url),
                   gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                   sampler="random", batch=batch, progress=False, warm_start=False, **fields)


def test_the_phases_cover_the_search_loop(tmp_path):
    """A consistency check: the main thread's phases add up to at most the loops' wall time and
    cover most of it; every recorded trial and every GPU answer is counted."""
    with live(tmp_path, queue_depth=2, measure_s=MEASURE_S) as evaluator:
        measured, session = study(evaluator, tmp_path / "run", trials=8)
    phases = session.phases
    assert phases.trials == len(measured) == 8
    assert phases.answers == sum(state != "compile_error" for state, *_ in measured.values())
    assert 0 < phases.in_loop() <= phases.loop_s + 1e-6
    assert phases.in_loop() >= 0.5 * phases.loop_s, phases.as_dict()
    assert len(phases.loops) == 1 and phases.counts["store"] >= 8
    # the child slept MEASURE_S per answer, split over load / verify / time
    assert sum(phases.child.values()) >= 0.9 * MEASURE_S * phases.answers
    assert 0 < phases.kernel_s <= sum(phases.child.values())
    assert phases.round_trip_s >= sum(phases.child.values())  # posted → read spans the work
    # the child's spans: one per answer, in order, inside the loop, as long as its work
    (start, end), = phases.loops
    assert len(phases.child_spans) == phases.answers
    assert all(start <= a < b <= end for a, b in phases.child_spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(phases.child_spans, phases.child_spans[1:]))
    assert sum(b - a for a, b in phases.child_spans) >= sum(phases.child.values())


def test_child_idle_charges_each_gap_to_a_study_boundary_or_to_a_study():
    throughput = bench_module("throughput")
    spans = [(1.0, 2.0), (2.5, 3.0), (4.0, 5.0), (5.01, 6.0)]
    loops = [(0.9, 3.2), (3.6, 6.1)]  # the first study's loop ends in the gap 3.0-4.0
    idle = throughput.child_idle(spans, loops, (0.0, 7.0), excluded=[(0.0, 0.5)])
    assert idle["before_first_s"] == pytest.approx(0.5)  # 0.5-1.0: the set-up is excluded
    assert idle["between_studies_s"] == pytest.approx(1.0)
    assert idle["in_studies_s"] == pytest.approx(0.5 + 0.01)  # 2.0-2.5, 5.0-5.01
    assert idle["in_studies_gaps_over_50ms"] == 1
    assert idle["after_last_s"] == pytest.approx(1.0)
    assert idle["child_busy_share"] == pytest.approx(3.49 / 6.5)


def test_child_idle_tells_the_shape_changes_from_the_boundaries_inside_a_shape():
    """Two shapes of two studies: the gap where the first shape's last loop ends is a shape
    change, the one where a shape's first loop ends is inside the shape; both are between
    studies. The last loop's end is no change."""
    throughput = bench_module("throughput")
    spans = [(0.0, 1.0), (1.2, 2.0), (2.5, 3.0), (3.1, 4.0), (4.2, 5.0)]
    loops = [(0.0, 1.1), (1.1, 2.2), (2.2, 3.05), (3.05, 4.9)]
    idle = throughput.child_idle(spans, loops, (0.0, 5.0), per_shape=2)
    assert idle["between_studies_s"] == pytest.approx(0.2 + 0.5 + 0.1)  # loops 0, 1, 2 end
    assert idle["at_shape_changes_s"] == pytest.approx(0.5)  # 2.0-2.5: loop 1, shape 1's last
    assert idle["in_studies_s"] == pytest.approx(0.2)  # 4.0-4.2
    assert throughput.child_idle(spans, loops, (0.0, 5.0))["at_shape_changes_s"] == 0.0


def test_the_longest_gaps_say_when_and_where_the_gpu_child_waited():
    throughput = bench_module("throughput")
    spans = [(1.0, 2.0), (2.5, 3.0), (4.0, 5.0), (5.01, 6.0)]
    loops = [(0.9, 3.2), (3.6, 6.1)]
    gaps = throughput.longest_gaps(spans, loops, ["naive", "smem"], 0.0, 7.0, top=4)
    assert [(g["from_s"], g["where"]) for g in gaps] == [
        (0.0, "the command's start"), (3.0, "in naive's loop"), (6.0, "in smem's loop"),
        (2.0, "in naive's loop")]
    assert [g["seconds"] for g in gaps] == pytest.approx([1.0, 1.0, 1.0, 0.5])
    assert throughput.longest_gaps(spans, [(0.9, 3.2), (3.6, 6.1)], ["naive", "smem"], 0.0, 7.0,
                                   top=1) == [gaps[0]]
    (between,) = throughput.longest_gaps([(1.0, 3.3), (3.5, 4.0)], loops, ["naive", "smem"],
                                         1.0, 4.0, top=1)
    assert between["where"] == "before smem's loop" and between["seconds"] == pytest.approx(0.2)


def test_each_gap_is_split_by_the_innermost_main_thread_phase_it_overlaps():
    throughput = bench_module("throughput")
    # a study's set-up waits for its start-up (nested in it), then the loop proposes
    spans = {"study_start": [(1.0, 3.0)], "startup_wait": [(1.5, 2.5)],
             "propose": [(3.2, 3.6)], "gpu_wait": [(5.0, 6.0)]}
    split = throughput.gap_phases(0.5, 4.0, spans)
    assert split == pytest.approx({"startup_wait": 1.0, "study_start": 1.0, "other": 1.1,
                                   "propose": 0.4})
    assert list(split)[0] == "other" and list(split)[-1] == "propose"  # largest first
    assert sum(split.values()) == pytest.approx(3.5)  # the stretch, nothing counted twice
    assert throughput.gap_phases(4.0, 4.5, spans) == pytest.approx({"other": 0.5})
    # summed over the child's gaps over 50 ms only, between its first answer and its last
    answers = [(0.0, 0.5), (4.0, 5.0), (5.02, 6.0), (6.5, 7.0)]
    assert throughput.idle_by_phase(answers, spans) == pytest.approx(
        {"startup_wait": 1.0, "study_start": 1.0, "other": 1.6, "propose": 0.4})
    (longest,) = throughput.longest_gaps(answers, [(0.2, 7.0)], ["naive"], 0.0, 7.0, top=1,
                                         spans=spans)
    assert longest["seconds"] == pytest.approx(3.5) and longest["phases"] == pytest.approx(split)


def test_per_study_rows_split_the_tuning_span_at_each_loop_end():
    throughput = bench_module("throughput")

    class Cpu:  # the sampler's mean over a window, recorded to check the windows
        windows: list[tuple[float, float]] = []

        def mean(self, a, b):
            self.windows.append((a, b))
            return 0.5

        def mean_compiling(self, a, b, workers):
            return (14.0, 2.0) if a == 0.0 else (3.0, 0.0)

    spans = [(1.0, 2.0), (2.5, 3.0), (4.0, 5.0)]
    rows = throughput.per_study(["naive", "smem"], [(3.6, 6.0), (0.9, 3.2)], spans, 0.0, Cpu(),
                                workers=14, waits=[(3.0, 3.5)])
    assert [r["family"] for r in rows] == ["naive", "smem"]
    assert Cpu.windows == [(0.0, 3.2), (3.2, 6.0)]  # from the last loop's end, set-up included
    assert [r["answers"] for r in rows] == [2, 1]
    assert [r["set_up_s"] for r in rows] == pytest.approx([0.9, 0.4])
    assert rows[0]["child_busy_share"] == pytest.approx(1.5 / 3.2)
    assert rows[1]["child_busy_share"] == pytest.approx(1.0 / 2.8)
    # the child's idle time in each: before its first answer, between answers, after its last
    assert [r["idle_head_s"] for r in rows] == pytest.approx([1.0, 0.8])
    assert [r["idle_mid_s"] for r in rows] == pytest.approx([0.5, 0.0])
    assert [r["idle_tail_s"] for r in rows] == pytest.approx([0.2, 1.0])
    assert [r["workers_busy"] for r in rows] == [14.0, 3.0]
    assert [r["workers_busy_ahead"] for r in rows] == [2.0, 0.0]
    # a start-up's wait is charged to the study whose span holds it
    assert [r["startup_wait_s"] for r in rows] == pytest.approx([0.2, 0.3])


def test_a_measurement_over_a_loops_end_is_not_idle_on_either_side():
    """A measurement that began in one study's loop and ended after it (the next study's
    candidate, posted ahead) is counted as an answer where it ends, and as work on both sides:
    no tail idle for the study before, no head idle for the one after."""
    throughput = bench_module("throughput")

    class Cpu:
        def mean(self, a, b):
            return 0.5

    spans = [(1.0, 2.0), (2.5, 3.0), (3.0, 3.4), (4.0, 5.0)]
    rows = throughput.per_study(["naive", "smem"], [(0.9, 3.2), (3.6, 6.0)], spans, 0.0, Cpu())
    assert [r["answers"] for r in rows] == [2, 2]
    assert [r["idle_tail_s"] for r in rows] == pytest.approx([0.0, 1.0])
    assert [r["idle_head_s"] for r in rows] == pytest.approx([1.0, 0.0])
    assert [r["idle_mid_s"] for r in rows] == pytest.approx([0.5, 0.6])


def test_throughput_bench_runs_end_to_end_on_the_stand_in(tmp_path):
    out = tmp_path / "throughput.json"
    env = dict(os.environ, GEMMTUNE_GPU_BACKEND="tuner.testing")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "throughput.py"), "--family", "naive",
         "--shape", "64x48x32", "--timeout", "120", "--trials", "6", "--sampler", "random",
         "--standin-measure-s", str(MEASURE_S), "--cache", str(tmp_path / "cubins"),
         "--out", str(out), "--timeline", str(tmp_path / "timeline.json")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["trials"] == 6 and result["backend"] == "tuner.testing"
    # the timeline: every answer, the loop, the main thread's phases, inside the command's wall
    seen = json.loads((tmp_path / "timeline.json").read_text())
    assert len(seen["child"]) == result["gpu_answers"]
    ((family, loop_from, loop_to),) = seen["loops"]
    assert family == "naive" and 0 < loop_from < loop_to <= result["wall_s"]
    assert {"propose", "gpu_wait", "study_storage"} <= set(seen["main"])
    assert len(seen["main"]["gpu_wait"]) == result["raw"]["counts"]["gpu_wait"]
    spans = seen["child"] + [span for spans in seen["main"].values() for span in spans]
    assert all(0 <= a <= b <= result["wall_s"] for a, b in spans)
    assert result["gpu_busy"]["nvml_share"] is None  # no NVML here: said so, not invented
    assert "not available" in result["gpu_busy"]["nvml_source"]
    assert result["gpu_busy"]["kernel_time_s"] > 0
    shares = sum(r["share"] for r in result["phases"].values())
    assert shares == pytest.approx(1.0, abs=1e-6)  # the rows divide the tuning wall time
    idle = result["child_idle"]
    busy_s = idle["child_busy_share"] * result["tuning_s"]
    idle_s = sum(idle[name] for name in ("before_first_s", "between_studies_s", "in_studies_s",
                                         "after_last_s"))
    assert busy_s + idle_s == pytest.approx(result["tuning_s"], rel=0.02)  # = the tuning wall
    assert "configs/s" in done.stdout and "kernel time" in done.stdout
    assert result["best_gflops"]["64x48x32"]["naive"] > 0  # what the study found, stored
    (study,) = result["studies"]
    assert study["family"] == "naive" and study["answers"] == result["gpu_answers"]
    assert 0 < study["host_cpu_share"] <= 1
    # where the start went: its parts are the command's start (the child's start beside them)
    start = result["start_parts"]
    assert set(start) == {"start_imports", "start_wait", "setup"} and start["start_imports"] > 0
    assert sum(start.values()) <= result["start_s"] + 1e-6
    assert set(result["study_start_parts"]) == {"startup_wait", "study_storage", "study_model", "study_prior"}
    assert result["study_start_parts"]["study_storage"] > 0  # the run record, at least
    assert "one-time start: start_imports" in done.stdout
    assert result["longest_gaps"] and "longest with the GPU child idle" in done.stdout
    for gap in result["longest_gaps"]:  # what the main thread did meanwhile, the whole gap
        assert sum(gap["phases"].values()) == pytest.approx(gap["seconds"])
    assert set(result["idle_by_phase"]) <= set(seen["main"]) | {"other"}


def test_a_slow_compile_at_the_head_of_the_window_does_not_hold_back_the_others(tmp_path):
    """Candidates go to the GPU in the order their compiles finish (``ready``), not in the order
    they were asked; none is lost or measured twice."""
    from tuner.measure.testing import StandInEvaluator

    class SlowFirstCompile(StandInEvaluator):
        def ready(self, family, config) -> bool:  # the first config asked "compiles" forever
            return (family.name, dict(config)) != self.prepared[0]

    evaluator = SlowFirstCompile()
    session = standin_session(evaluator, tmp_path, batch=4)
    run_study(session, NAIVE, SMALL, Budget(trials=6, timeout_s=None, patience=None))
    measured = [config for _, config, _ in evaluator.calls]
    prepared = [config for _, config in evaluator.prepared]
    assert measured[0] != prepared[0] and prepared[0] in measured
    assert sorted(map(sorted, map(dict.items, measured))) == \
        sorted(map(sorted, map(dict.items, prepared)))
    session.database.close()


def test_near_its_time_limit_a_study_asks_only_what_it_can_still_measure(tmp_path, monkeypatch):
    """The window (16 here) stops filling with candidates that the time left cannot measure:
    at the end, at most about the evaluator's queue was asked and never measured (before, the
    whole window: 15 here, 14 per study on the H100 with a fresh CUBIN cache). The study's
    clock advances 1/64 s per measurement (exact in binary) and only then, so the count does not depend on how
    busy the test machine is (a real sleep left 7-12 unmeasured on a loaded CI machine)."""
    from tuner.measure.testing import StandInEvaluator
    from tuner.search import study as study_module

    class Clock:  # the study's ``time`` module, with a monotonic clock of its own
        now = 1024.0

        def monotonic(self) -> float:
            return self.now

        def __getattr__(self, name):
            return getattr(time, name)

    clock = Clock()
    monkeypatch.setattr(study_module, "time", clock)

    class Slow(StandInEvaluator):  # a GPU that takes 1/64 s per candidate
        def evaluate(self, family, config, problem):
            clock.now += 1 / 64
            return super().evaluate(family, config, problem)

    evaluator = Slow()
    session = standin_session(evaluator, tmp_path, batch=16)
    outcome = run_study(session, kernels.get_family("blocktile1d"), Problem(512, 512, 512),
                        Budget(trials=10_000, timeout_s=2.0, patience=None))
    assert outcome.stop_reason == "time budget" and outcome.measured_now == 128
    asked_unmeasured = len(evaluator.prepared) - len(evaluator.calls)
    assert 0 <= asked_unmeasured <= 2, (len(evaluator.prepared), len(evaluator.calls))
    # and those few are let go: the evaluator drops their compiles
    measured = [config for _, config, _ in evaluator.calls]
    assert sorted(map(sorted, (c.items() for _, c in evaluator.discarded))) == sorted(
        sorted(c.items()) for _, c in evaluator.prepared if c not in measured)
    session.database.close()


def test_a_cached_cubin_is_read_at_once_not_queued_behind_compiles(tmp_path):
    """A config the CUBIN cache holds (the prior's or the prepared start-up's compiles) is
    answered by the pool without a worker: a new study's first window does not wait behind the
    compiles its predecessor left running."""
    from tuner.measure.live import CompilePool

    cache = tmp_path / "cubins"
    config = {"TILE": 16}
    built = kernels.compile_config(kernels.get_family("smem"), config, "sm_90", cache_dir=cache)
    pool = CompilePool("sm_90", cache, workers=1)
    try:
        hit = pool.submit(kernels.get_family("smem"), config)
        assert hit.done() and hit.result().cubin == built.cubin
        assert pool._executor is None  # no worker was needed (none even started)
        miss = pool.submit(kernels.get_family("smem"), {"TILE": 8})
        assert miss.result(timeout=120).cubin and pool._executor is not None
    finally:
        pool.close()


def test_one_config_in_two_layouts_is_two_programs_in_the_pool_and_the_evaluator(tmp_path):
    """One command tunes several layouts of a family (a workload): the same config of each is
    its own program. Keyed by family and config alone, the second layout was handed the first
    layout's CUBIN and hung or faulted on the GPU."""
    from tuner.measure.live import CompilePool

    smem, config = kernels.get_family("smem"), {"TILE": 16}
    views = {layout: kernels.bind(smem, layout) for layout in ("nt", "tn")}
    want = {layout: kernels.compile_config(smem, config, "sm_90", cache_dir=tmp_path / "direct", layout=layout).cubin
            for layout in views}
    assert want["nt"] != want["tn"]
    pool = CompilePool("sm_90", tmp_path / "cubins", workers=1)
    try:
        for layout, view in views.items():
            assert pool.submit(view, config).result(timeout=120).cubin == want[layout], layout
    finally:
        pool.close()
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1, backend="tuner.testing") as evaluator:
        for view in views.values():
            evaluator.prepare(view, config)
        futures = [evaluator._compiles[evaluator._key(view, config)] for view in views.values()]
        assert [f.result(timeout=120).cubin for f in futures] == [want["nt"], want["tn"]]


def _sharing_and_other(name: str) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Two accepted configs of a family that differ only in RASTER (launch-time: one CUBIN),
    and one of another CUBIN."""
    family = kernels.get_family(name)
    accepted = kernels.space.enumerate_accepted(family, "sm_90")
    first = next(accepted)
    rasters = dict((p.name, p.values) for p in family.params)["RASTER"]
    other = next(c for c in accepted
                 if kernels.compiler.cubin_key(family, c) != kernels.compiler.cubin_key(family, first))
    return dict(first, RASTER=rasters[0]), dict(first, RASTER=rasters[1]), other


def test_configs_that_share_a_cubin_share_one_compile(tmp_path):
    """Configs differing only in launch-time parameters build one CUBIN: the pool hands the
    second the first's compile instead of a worker that would wait on the cache entry's lock."""
    from tuner.measure.live import CompilePool

    vectorized = kernels.get_family("vectorized")
    one, two, other = _sharing_and_other("vectorized")
    pool = CompilePool("sm_90", tmp_path / "cubins", workers=2)
    try:
        first, second, third = (pool.submit(vectorized, c) for c in (one, two, other))
        assert second is first and third is not first
        assert first.result(timeout=120).cubin and third.result(timeout=120).cubin
        assert pool._building == {}  # built: read from the cache from now on
        again = pool.submit(vectorized, two)
        assert again.done() and again.result().cubin == first.result().cubin
    finally:
        pool.close()


def test_discarding_one_of_two_configs_that_share_a_compile_keeps_it_for_the_other(tmp_path):
    vectorized = kernels.get_family("vectorized")
    one, two, other = _sharing_and_other("vectorized")
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1,
                       backend="tuner.testing") as evaluator:
        evaluator.prepare(vectorized, other)  # the one worker compiles it: the next two wait
        evaluator.prepare(vectorized, one)
        evaluator.prepare(vectorized, two)
        evaluator.discard(vectorized, one)
        shared = evaluator._compiles[evaluator._key(vectorized, two)]
        assert not shared.cancelled() and shared.result(timeout=120).cubin
        evaluator.discard(vectorized, two)
        assert list(evaluator._compiles) == [evaluator._key(vectorized, other)]


def test_a_discarded_candidate_leaves_nothing_behind_in_the_evaluator(tmp_path):
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1,
                       backend="tuner.testing") as evaluator:
        smem = kernels.get_family("smem")
        evaluator.prepare(smem, {"TILE": 8})
        evaluator.prepare(smem, {"TILE": 16})
        evaluator.discard(smem, {"TILE": 8})
        evaluator.discard(smem, {"TILE": 32})  # never prepared: nothing to do
        assert list(evaluator._compiles) == [evaluator._key(smem, {"TILE": 16})]


def test_the_compile_processes_start_with_the_evaluator(tmp_path):
    """Started with the GPU child (one-time start), not at the first compiles of the first
    study, where the GPU waited ~4 s for them on the H100 host."""
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=2,
                       backend="tuner.testing") as evaluator:
        executor = evaluator.pool._executor
        assert executor is not None and len(executor._processes) == 2
        assert evaluator.pool.arch == evaluator.arch()
    assert evaluator.pool._executor is None  # closed with the evaluator


def test_the_next_study_is_built_while_the_gpu_measures_the_last_candidates(tmp_path,
                                                                              monkeypatch):
    """tune_all builds a shape's next study (its start-up taken, sampler and storage set up)
    before the study before it has recorded its last answers, which the GPU child is still
    measuring: that set-up no longer leaves the GPU idle at every boundary (issue 19)."""
    from tuner.run import session as run_session
    from tuner.search import study as study_module

    events: list[str] = []
    init, measure = study_module.StudyRun.__init__, study_module.StudyRun._measure_next

    def logged_init(self, session, family, *args, **kwargs):
        events.append(f"build {family.name}")
        init(self, session, family, *args, **kwargs)

    def logged_measure(self, *args, **kwargs):
        measurement = measure(self, *args, **kwargs)
        if measurement is not None:
            events.append(f"recorded {self.family.name}")
        return measurement

    monkeypatch.setattr(study_module.StudyRun, "__init__", logged_init)
    monkeypatch.setattr(study_module.StudyRun, "_measure_next", logged_measure)
    with live(tmp_path, queue_depth=2, measure_s=MEASURE_S) as evaluator:
        session = standin_session(evaluator, tmp_path, evaluator.batch)
        summary = run_session.tune_all(session, [NAIVE, kernels.get_family("smem")], [SMALL],
                                       Budget(trials=4, timeout_s=120, patience=None))
        session.database.close()
    assert [outcome.measured for _, _, outcome in summary.outcomes] == [4, 3]  # smem has 3
    second = events.index("build smem")
    assert events[:second].count("recorded naive") < 4 <= events.count("recorded naive")
    assert "recorded smem" not in events[:second]


def test_a_study_hands_the_gpu_its_first_compiled_candidate_before_the_window_is_full(
        tmp_path, monkeypatch):
    """With the CUBIN cache warm (a study's start-up, compiled ahead), the first candidate goes
    to the GPU child as soon as it is asked, not after the window's last ask (issue 19)."""
    from tuner.search import study as study_module

    with live(tmp_path, queue_depth=2) as evaluator:
        study(evaluator, tmp_path / "cold", trials=4)  # fills the cache with these configs
        events: list[str] = []
        ask, submit = study_module.StudyRun._ask, evaluator.submit

        def logged_ask(self):
            events.append("ask")
            return ask(self)

        def logged_submit(*args, **kwargs):
            events.append("submit")
            return submit(*args, **kwargs)

        monkeypatch.setattr(study_module.StudyRun, "_ask", logged_ask)
        monkeypatch.setattr(evaluator, "submit", logged_submit)
        study(evaluator, tmp_path / "warm", trials=4)
    assert evaluator.batch >= 3 and events.count("submit") == 4
    assert events[:3] == ["ask", "submit", "ask"], events


def test_a_stopped_study_drops_its_compiles_before_the_next_one_is_built(tmp_path,
                                                                         monkeypatch):
    """Candidates still compiling when a stop rule holds are never measured: their compiles
    are dropped before the next study is built (the build may wait for a start-up prepared by
    a niced process, which those compiles would otherwise starve)."""
    from tuner.run import session as run_session
    from tuner.search import study as study_module

    events: list[str] = []
    init = study_module.StudyRun.__init__

    def logged_init(self, session, family, *args, **kwargs):
        events.append(f"build {family.name}")
        init(self, session, family, *args, **kwargs)

    monkeypatch.setattr(study_module.StudyRun, "__init__", logged_init)
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=2, queue_depth=2,
                       backend="tuner.testing",
                       backend_options={"measure_s": MEASURE_S}) as evaluator:
        discard = evaluator.discard

        def logged_discard(family, config):
            events.append(f"discard {family.name}")
            discard(family, config)

        monkeypatch.setattr(evaluator, "discard", logged_discard)
        session = standin_session(evaluator, tmp_path, evaluator.batch)
        summary = run_session.tune_all(session, [NAIVE, kernels.get_family("smem")], [SMALL],
                                       Budget(trials=40, timeout_s=120, patience=1))
        session.database.close()
    assert summary.outcomes[0][2].stop_reason == "patience"
    assert "discard naive" in events
    assert events.index("discard naive") < events.index("build smem")


def test_compiles_begun_ahead_use_only_idle_workers_and_a_later_submit_takes_them(tmp_path):
    """``compile_ahead`` starts compiles for the cache on workers idle now, leaving
    SPARE_WORKERS idle, and never twice for one CUBIN; the study's later submit of such a
    config takes that compile (counted as taken) and measures it as any other."""
    from tuner.measure import live as live_module

    smem = kernels.get_family("smem")
    configs = [{"TILE": 8}, {"TILE": 16}, {"TILE": 32}]
    workers = live_module.SPARE_WORKERS + 2
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=workers,
                       backend="tuner.testing") as evaluator:
        pool = evaluator.pool
        assert evaluator.compile_ahead(smem, iter(configs)) == 2  # the third: no idle worker
        assert pool.ahead_begun == 2 and pool.idle() == live_module.SPARE_WORKERS
        for future in list(pool._building.values()):
            future.result(timeout=120)
        assert pool.idle() == workers
        assert evaluator.compile_ahead(smem, iter(configs[:2])) == 0  # built already
        measurement = evaluator.evaluate(smem, configs[0], SMALL)
        assert measurement.state == "ok" and pool.ahead_taken == 1
        evaluator.evaluate(smem, configs[0], SMALL)
        assert pool.ahead_taken == 1  # a CUBIN is counted once



def test_throughput_bench_on_two_gpus_reports_per_gpu(tmp_path):
    """--gpus 0,1: one search on two stand-in GPUs; the GPU figures are per GPU, so two lanes
    each busy half the time read 50 %, not 100 %."""
    out = tmp_path / "throughput.json"
    env = dict(os.environ, GEMMTUNE_GPU_BACKEND="tuner.testing", GEMMTUNE_STANDIN_GPUS="2")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "throughput.py"), "--family", "naive",
         "--shape", "64x48x32", "--timeout", "120", "--trials", "8", "--sampler", "random",
         "--standin-measure-s", str(MEASURE_S), "--cache", str(tmp_path / "cubins"),
         "--gpus", "0,1", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["gpus"] == 2 and "--gpus 0,1" in result["command"]
    assert result["trials"] == 8 and result["gpu_answers"] == 8
    busy = result["gpu_busy"]
    assert busy["kernel_time_share"] == pytest.approx(
        busy["kernel_time_s"] / (2 * result["tuning_s"]))
    assert 0 < result["child_idle"]["child_busy_share"] <= 1
    assert "per GPU, 2 GPUs" in done.stdout


def test_throughput_bench_refuses_gpu_with_gpus(capsys):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "throughput.py"), "--gpu", "0", "--gpus", "0,1"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_a_budget_runs_the_default_command_itself(capsys):
    """``--budget`` passes the command's shared wall time instead of a time per study, and
    without --shape and --family the command's own defaults stand: the default command."""
    import argparse

    from tuner.problem import DEFAULT_SHAPES
    from tuner.run.cli import parse_args

    throughput = bench_module("throughput")
    args = argparse.Namespace(gpus=None, gpu=0, budget=780.0, timeout=None, trials=80,
                              patience=25, seed=0, sampler="default", workers=None, family=[],
                              shape=[])
    argv = throughput.tuner_argv(args, Path("results.sqlite"), Path("cubins"))
    assert argv[argv.index("--budget") + 1] == "780" and "--timeout" not in argv
    options = parse_args(argv)
    assert options.problems == list(DEFAULT_SHAPES) and not options.kernels_named
    assert options.budget.total_s == 780 and options.budget.timeout_s is None
    with pytest.raises(SystemExit):
        throughput.main(["--timeout", "5", "--budget", "60"])
    assert "not allowed with argument" in capsys.readouterr().err
