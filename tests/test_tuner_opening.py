"""The opening (tuner.measure.live.Opening): what the GPU child measures while the command still
starts, on CPU with real NVRTC compiles in the spawn pool and a real child process running the
stand-in bench. Each candidate is measured once: the study's ask takes the opening's answer."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import db
import kernels
import pytest
from tuner.lifetime import kill_pool
from tuner.measure.live import CompilePool, LiveEvaluator, Opening
from tuner.measure.phases import SETUP
from tuner.measure.testing import NAME_ENV, PLANTED_COMPILE_ERROR, PLANTED_OK, PlantedFamily
from tuner.problem import Problem, config_key

PLANTED = PlantedFamily()
SMALL = Problem(64, 48, 32)
NAIVE = kernels.get_family("naive")
NAIVE_CONFIGS = [{"BX": 32, "BY": 4, "COALESCED": 1}, {"BX": 16, "BY": 16, "COALESCED": 0},
                 {"BX": 64, "BY": 4, "COALESCED": 1}]


def opening(*candidates: tuple[object, dict[str, int]], problem: Problem = SMALL) -> Opening:
    return Opening(problem, lambda arch: list(candidates))


def _command(argv: list[str]) -> LiveEvaluator:
    """``python -m tuner`` with these arguments, on the stand-in (GEMMTUNE_GPU_BACKEND set by
    the test), as ``live_main`` runs it; every answer the opening or a post ahead gave was taken
    by its study. The evaluator, closed."""
    from tuner.run.cli import parse_args
    from tuner.run.tune import start_command, tune

    options = parse_args(argv)
    evaluator, process = start_command(options)
    with evaluator:
        try:
            assert tune(options, evaluator, progress=False, preparer=process) == 0
        finally:
            kill_pool(process)
        assert not evaluator._opened
    return evaluator


def test_the_opening_is_posted_before_the_search_and_its_answer_goes_to_the_ask(tmp_path):
    ok, broken = {"MODE": PLANTED_OK}, {"MODE": PLANTED_COMPILE_ERROR}
    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       opening=opening((PLANTED, ok), (PLANTED, broken), (PLANTED, ok))) as evaluator:
        # the problem is set and the candidate that compiled waits with the child, once
        assert evaluator.problem == SMALL and len(evaluator.lanes[0].queued) == 1
        evaluator.set_problem(SMALL)  # the command's own set-up: nothing to do
        assert evaluator.baseline().gflops > 0  # timed by the opening
        assert evaluator.phases.seconds.get(SETUP, 0.0) == 0.0  # nothing set up or timed again
        assert evaluator.ready(PLANTED, ok)
        ticket = evaluator.submit(PLANTED, ok, SMALL)
        assert ticket is evaluator.lanes[0].queued[0] and len(evaluator.lanes[0].queued) == 1
        assert evaluator.collect(ticket).state == "ok" and evaluator.phases.answers == 1
        assert evaluator.evaluate(PLANTED, broken, SMALL).state == "compile_error"
        # asked again: measured again, as any second ask is
        assert evaluator.evaluate(PLANTED, ok, SMALL).state == "ok"
        assert evaluator.phases.answers == 2


def test_the_openings_ready_hook_gets_the_started_evaluator_before_the_candidates(tmp_path):
    """``Opening.ready`` (the start's work that needs the GPU's model: the first shape's prior
    compiles) is called once, with the evaluator, once the GPU child is ready and before the
    candidates are listed; one that fails leaves the opening to go on."""
    calls: list[tuple[str, object]] = []

    def ready(evaluator: LiveEvaluator) -> None:
        calls.append(("ready", (evaluator.arch(), evaluator.info()["sm_count"], evaluator.batch)))
        raise RuntimeError("a failing hook")

    def candidates(arch: str) -> list[tuple[object, dict[str, int]]]:
        calls.append(("candidates", arch))
        return [(PLANTED, {"MODE": PLANTED_OK})]

    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       opening=Opening(SMALL, candidates, ready)) as evaluator:
        assert evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL).state == "ok"
        assert evaluator.phases.answers == 1  # the opening's answer, taken by the ask
        arch, batch = evaluator.arch(), evaluator.batch
    assert calls == [("ready", (arch, 132, batch)), ("candidates", arch)]


def test_the_first_shapes_prior_compiles_begin_at_the_start_for_its_first_ranked_study(
        tmp_path):
    """``preparer.compile_prior`` (run in a preparing process once the GPU is named): the
    prior's compiles of the first problem's later studies that start from the prior, as the
    GPU model's bundled recordings tell, up to the first whose prior ranks. On the H200,
    pipelined (recorded there) is passed over, smem (three configs, all of its start-up)
    compiled and passed, blocktile1d's compiled; naive, after it, is not reached. The
    start-up planned later finds every compile it needs in the cache."""
    from tuner.search import preparer
    from tuner.search.study import prepare_startup

    cache = tmp_path / "cubins"
    problem = Problem(256, 256, 256)
    warmed = preparer.compile_prior(["pipelined", "smem", "blocktile1d", "naive"], "NVIDIA H200",
                                    "sm_90", problem, 132, 4, 7, str(cache), "default",
                                    prior_compiles=3)
    assert warmed == "blocktile1d"
    compiled = {path.name for path in cache.rglob("*.cubin")}
    assert len(compiled) == 3 + 3  # smem's three, blocktile1d's prior compiles (3 here)
    startup = prepare_startup("blocktile1d", "sm_90", problem, "default", 132, 4, 7, 3,
                              str(cache), True)
    assert startup.ranking is not None and startup.ranking.compiled == 3
    assert {path.name for path in cache.rglob("*.cubin")} == compiled  # nothing compiled again


def test_an_opening_answer_nobody_asks_for_is_read_and_dropped(tmp_path):
    ok = {"MODE": PLANTED_OK}
    other = Problem(32, 32, 32)
    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       opening=opening((PLANTED, ok))) as evaluator:
        evaluator.set_problem(other)  # e.g. a resumed study never asks for its warm start
        assert not evaluator.lanes[0].queued and evaluator.phases.answers == 1
        baseline = evaluator.baseline()  # timed on the new problem, not the opening's
        assert baseline.gflops > 0 and evaluator.phases.seconds.get(SETUP, 0.0) > 0
        ticket = evaluator.submit(PLANTED, ok, other)
        assert ticket.request is not None and evaluator.collect(ticket).state == "ok"
        assert evaluator.phases.answers == 2


def test_an_opening_that_cannot_list_its_candidates_still_starts_the_command(tmp_path):
    def broken(arch: str) -> list:
        raise KeyError("a family the opening did not expect")

    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       opening=Opening(SMALL, broken)) as evaluator:
        assert evaluator.problem == SMALL and not evaluator.lanes[0].queued
        assert evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL).state == "ok"


def test_the_command_s_first_work_stops_the_opening_and_keeps_the_rest_as_compiles(tmp_path):
    """The opening goes on after ``wait_started`` (the command's imports, stores and first
    set-up) and stops at the first work handed to the evaluator, wherever it is: each
    candidate is then either with the child or a prepared compile, and every ask is measured
    once."""
    started = LiveEvaluator(0, cache_dir=tmp_path, workers=2, backend="tuner.testing",
                            wait=False,
                            opening=opening(*((NAIVE, config) for config in NAIVE_CONFIGS)))
    with started as evaluator:
        evaluator.wait_started()
        assert evaluator._starting is not None  # still posting
        assert all(evaluator.prepare(NAIVE, c) is None for c in NAIVE_CONFIGS)  # nothing new
        assert evaluator._starting is None  # stopped by the first prepare
        posted = len(evaluator.lanes[0].queued)
        assert len(evaluator._compiles) == len(NAIVE_CONFIGS) - posted
        tickets = [evaluator.submit(NAIVE, config, SMALL) for config in NAIVE_CONFIGS]
        assert [evaluator.collect(t).state for t in tickets] == ["ok"] * len(NAIVE_CONFIGS)
        assert evaluator.phases.answers == len(NAIVE_CONFIGS)


def test_the_opening_posts_after_the_start_until_the_command_hands_over_work(tmp_path,
                                                                            monkeypatch):
    """The GPU would wait through the command's imports and set-up: compiles that finish after
    ``wait_started`` are posted too (here held until then), up to the command's first work."""
    gate = threading.Event()
    real = CompilePool.submit

    def held(pool: CompilePool, family: object, config: dict[str, int]) -> Future:
        compiled, out = real(pool, family, config), Future()

        def finish() -> None:
            gate.wait()
            out.set_result(compiled.result())

        threading.Thread(target=finish, daemon=True).start()
        return out

    monkeypatch.setattr(CompilePool, "submit", held)
    started = LiveEvaluator(0, cache_dir=tmp_path, workers=2, backend="tuner.testing",
                            wait=False,
                            opening=opening(*((NAIVE, config) for config in NAIVE_CONFIGS)))
    with started as evaluator:
        evaluator.wait_started()
        assert not evaluator.lanes[0].queued  # nothing compiled yet
        gate.set()
        deadline = time.monotonic() + 60
        while len(evaluator.lanes[0].queued) < len(NAIVE_CONFIGS):
            assert time.monotonic() < deadline, "the opening stopped posting"
            time.sleep(0.05)
        tickets = [evaluator.submit(NAIVE, config, SMALL) for config in NAIVE_CONFIGS]
        # the opening's own, posted in the order their compiles finished
        assert {id(t) for t in tickets} == {id(t) for t in evaluator.lanes[0].queued}
        assert [evaluator.collect(t).state for t in tickets] == ["ok"] * len(NAIVE_CONFIGS)
        assert evaluator.phases.answers == len(NAIVE_CONFIGS)


def test_the_command_measures_its_first_studys_starting_point_once(tmp_path, monkeypatch):
    """``python -m tuner``'s start (start_command) opens with naive's declared starting point,
    which the study's warm start asks for first: stored as its first trial, measured once."""
    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    url = f"sqlite:///{tmp_path / 'gemmtune.sqlite'}"
    evaluator = _command(["--kernel", "naive", "--shape", "64x48x32", "--trials", "5",
                          "--sampler", "random", "--workers", "2", "--db", url,
                          "--cache", str(tmp_path / "cubins")])
    assert evaluator.phases.answers == evaluator.phases.trials == 5
    database = db.open_database(url)
    try:
        (run,) = database.list_runs(family="naive")
        first = database.trials(run.id)[0]
        assert first.params == NAIVE.starting_points[0] and first.state == "ok"
    finally:
        database.close()


def test_a_later_shapes_first_asks_are_posted_before_its_study_is_built_and_measured_once(
        tmp_path, monkeypatch):
    """At each shape the first study's warm start (the tuned shapes' bests, the starting
    points) goes to the GPU right after the baseline, before the study is built; the study's
    asks take those answers: every trial measured once. A second run of the command on the same
    database (its studies resume) posts nothing."""
    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    posted: list[tuple[Problem, list[dict[str, int]], int]] = []
    real = LiveEvaluator.post_ahead

    def spy(evaluator: LiveEvaluator, family: object, configs) -> int:
        configs = list(configs)
        count = real(evaluator, family, configs)
        posted.append((evaluator.problem, configs, count))
        return count

    monkeypatch.setattr(LiveEvaluator, "post_ahead", spy)
    url = f"sqlite:///{tmp_path / 'gemmtune.sqlite'}"
    second = Problem(80, 64, 48)

    def command() -> LiveEvaluator:
        return _command(["--kernel", "naive", "--shape", "64x48x32", "--shape", "80x64x48",
                         "--trials", "5", "--sampler", "random", "--workers", "2",
                         "--retime-rounds", "0", "--db", url, "--cache", str(tmp_path / "cubins")])

    evaluator = command()
    assert evaluator.phases.answers == evaluator.phases.trials == 10
    (problem, configs, count), = [entry for entry in posted if entry[0] == second]
    assert count == len(configs) >= 1  # the first shape's best, the starting point (here one)
    database = db.open_database(url)
    try:
        run = [r for r in database.list_runs(family="naive") if (r.problem.m, r.problem.n, r.problem.k) == (80, 64, 48)][0]
        asked = [t.params for t in database.trials(run.id)]
        assert all(config in asked for config in configs)
        assert len({tuple(sorted(p.items())) for p in asked}) == len(asked) == 5
    finally:
        database.close()

    posted.clear()
    evaluator = command()  # resumed: nothing more to measure, nothing posted ahead
    assert posted == [] and evaluator.phases.trials == 0
    assert evaluator.phases.answers == 1  # the start's opening alone (its one starting point)


@pytest.mark.parametrize("ahead", [12, 0])
def test_each_studys_warm_start_is_posted_before_it_is_built_and_measured_once(
        tmp_path, monkeypatch, ahead):
    """Before each study is built (at a shape's start, and while the study before drains): its
    warm start, then the later studies' while fewer than AHEAD posted configs are unanswered
    (here all of them; with 0, none). A warm start is looked up once and posted once (posted
    again, nothing new goes to the GPU). Every config measured once, every posted answer taken
    by its study's ask."""
    import tuner.run.session as session_module

    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    monkeypatch.setattr(session_module, "AHEAD", ahead)
    events: list[tuple[str, Problem | None, str, int]] = []
    real_post, real_run = LiveEvaluator.post_ahead, session_module.StudyRun

    def post(evaluator: LiveEvaluator, family, configs) -> int:
        count = real_post(evaluator, family, configs)
        events.append(("post", evaluator.problem, family.name, count))
        return count

    def build(session, family, problem, *args, **kwargs):
        events.append(("build", problem, family.name, 0))
        return real_run(session, family, problem, *args, **kwargs)

    looked_up: list[tuple[str, Problem]] = []
    real_warm_start = session_module.warm_start

    def warm_start(database, gpu, family, problem, arch):
        looked_up.append((family.name, problem))
        return real_warm_start(database, gpu, family, problem, arch)

    monkeypatch.setattr(LiveEvaluator, "post_ahead", post)
    monkeypatch.setattr(session_module, "StudyRun", build)
    monkeypatch.setattr(session_module, "warm_start", warm_start)
    url = f"sqlite:///{tmp_path / 'gemmtune.sqlite'}"
    evaluator = _command(["--kernel", "naive", "--kernel", "smem", "--kernel", "blocktile1d",
                          "--shape", "64x48x32", "--shape", "80x64x48", "--trials", "3",
                          "--sampler", "random", "--workers", "2", "--retime-rounds", "0",
                          "--db", url, "--cache", str(tmp_path / "cubins")])
    assert evaluator.phases.answers == evaluator.phases.trials
    second = [(kind, family, count) for kind, problem, family, count in events
              if problem == Problem(80, 64, 48)]
    naive = ("post", "naive", second[0][2])
    assert second[0][2] >= 1  # naive's: the first shape's best, its starting point
    if ahead:
        assert second == [naive, ("post", "smem", 1), ("post", "blocktile1d", 1),
                          ("build", "naive", 0),
                          ("post", "smem", 0), ("post", "blocktile1d", 0), ("build", "smem", 0),
                          ("post", "blocktile1d", 0), ("build", "blocktile1d", 0)]
    else:
        assert second == [naive, ("build", "naive", 0),
                          ("post", "smem", 1), ("build", "smem", 0),
                          ("post", "blocktile1d", 1), ("build", "blocktile1d", 0)]
    assert len(looked_up) == len(set(looked_up)) == 6  # each study's warm start looked up once


def test_a_post_ahead_leaves_a_compile_still_running_to_the_ask(tmp_path, monkeypatch):
    """Only configs compiled already are posted ahead: one still compiling stays a prepared
    compile (the study being built must not wait on it), and is posted once it is done.
    ``posted_ahead`` counts those posted, not yet taken by an ask, whose answers are unread."""
    gate = threading.Event()
    real = CompilePool.submit

    def held(pool: CompilePool, family: object, config: dict[str, int]) -> Future:
        compiled, out = real(pool, family, config), Future()
        threading.Thread(target=lambda: (gate.wait(), out.set_result(compiled.result())),
                         daemon=True).start()
        return out

    monkeypatch.setattr(CompilePool, "submit", held)
    with LiveEvaluator(0, cache_dir=tmp_path, workers=2, backend="tuner.testing") as evaluator:
        evaluator.set_problem(SMALL)
        assert evaluator.post_ahead(NAIVE, NAIVE_CONFIGS) == 0
        assert not evaluator.lanes[0].queued and len(evaluator._compiles) == len(NAIVE_CONFIGS)
        gate.set()
        deadline = time.monotonic() + 60
        while not all(future.done() for future in evaluator._compiles.values()):
            assert time.monotonic() < deadline, "the compiles never finished"
            time.sleep(0.05)
        assert evaluator.post_ahead(NAIVE, NAIVE_CONFIGS) == len(NAIVE_CONFIGS)
        assert not evaluator._compiles and len(evaluator.lanes[0].queued) == len(NAIVE_CONFIGS)
        assert evaluator.posted_ahead() == len(NAIVE_CONFIGS)
        last = evaluator.submit(NAIVE, NAIVE_CONFIGS[-1], SMALL)  # taken: no longer ahead
        assert evaluator.posted_ahead() == len(NAIVE_CONFIGS) - 1
        assert evaluator.collect(last).state == "ok"  # the answers before it read on the way
        assert evaluator.posted_ahead() == 0 and len(evaluator._opened) == len(NAIVE_CONFIGS) - 1
        tickets = [evaluator.submit(NAIVE, config, SMALL) for config in NAIVE_CONFIGS[:-1]]
        assert [evaluator.collect(t).state for t in tickets] == ["ok"] * (len(NAIVE_CONFIGS) - 1)
        assert evaluator.phases.answers == len(NAIVE_CONFIGS)


def test_a_post_ahead_counts_what_went_to_the_gpu_not_a_compile_error(tmp_path):
    """A config that does not compile is answered at once (its ask takes the error), and is not
    counted as GPU work posted ahead."""
    ok, broken = {"MODE": PLANTED_OK}, {"MODE": PLANTED_COMPILE_ERROR}
    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing") as evaluator:
        evaluator.set_problem(SMALL)
        evaluator.pool.submit(PLANTED, ok).result()  # cached: posted at once
        assert evaluator.post_ahead(PLANTED, [ok, broken]) == 1
        evaluator._compiles[evaluator._key(PLANTED, broken)].result()  # the error, now done
        assert evaluator.post_ahead(PLANTED, [ok, broken]) == 0
        assert len(evaluator.lanes[0].queued) == 1 and not evaluator._compiles
        assert evaluator.evaluate(PLANTED, broken, SMALL).state == "compile_error"
        assert evaluator.evaluate(PLANTED, ok, SMALL).state == "ok"
        assert evaluator.phases.answers == 1


def test_the_opening_is_every_offered_familys_accepted_starting_points_in_study_order():
    """The first problem's studies, in the order they run, on this GPU: wgmma's starting
    points then naive's on a Hopper GPU; naive's alone where wgmma is not offered (Ampere);
    no more of a family's than a study's trial budget; then each space within that budget
    whole."""
    from tuner.run.cli import parse_args
    from tuner.run.tune import opening as opening_of

    plan = opening_of(parse_args(["--kernel", "wgmma", "--kernel", "naive",
                                  "--shape", "100x90x80", "--shape", "64x64x64", "--trials", "60"]))
    assert plan.problem == Problem(100, 90, 80)
    wgmma = kernels.get_family("wgmma")
    hopper = plan.candidates("sm_90")
    starting = len(wgmma.starting_points) + 1
    assert [f.name for f, _ in hopper[:starting]] == ["wgmma"] * (starting - 1) + ["naive"]
    assert len(wgmma.starting_points) > 1
    assert all(wgmma.accepts(c, "sm_90") for f, c in hopper if f.name == "wgmma")
    assert hopper[starting - 1][1] == dict(NAIVE.starting_points[0])
    # then naive's whole space (60 configs, 48 accepted: within the 60 trials), each once
    rest = [c for _, c in hopper[starting:]]
    assert {f.name for f, _ in hopper[starting:]} == {"naive"}
    assert sorted(map(sorted, [hopper[starting - 1][1]] + rest)) == sorted(
        map(sorted, NAIVE.accepted_configs("sm_90")))
    ampere = plan.candidates("sm_80")
    assert ampere[0] == (ampere[0][0], dict(NAIVE.starting_points[0]))
    assert len(ampere) == len(NAIVE.accepted_configs("sm_80"))
    # a space larger than the trial budget: its starting points alone
    fewer = opening_of(parse_args(["--kernel", "naive", "--shape", "100x90x80", "--trials", "59"]))
    assert [c for _, c in fewer.candidates("sm_90")] == [dict(NAIVE.starting_points[0])]
    short = opening_of(parse_args(["--kernel", "wgmma", "--shape", "100x90x80", "--trials", "2"]))
    assert [c for _, c in short.candidates("sm_90")] == [dict(c) for c in wgmma.starting_points[:2]]
    # a transposed problem's programs: the study binds the family the same way
    nt = opening_of(parse_args(["--kernel", "naive", "--shape", "100x90x80:nt"]))
    assert {kernels.bound_to(family) for family, _ in nt.candidates("sm_90")} == {("nt", 1)}


def test_the_start_loads_only_this_gpu_models_recordings(tmp_path, monkeypatch):
    """The model learns from the bundled recordings of the GPU model it tunes (tuner.search.
    learned); the start loads those, once the GPU child has said which model it is, and no
    other's (every model's took 1.24 s more on the 2-core machine)."""
    from tuner.measure import recording
    from tuner.run.cli import parse_args
    from tuner.run.tune import start_command

    asked: list[str] = []
    real = recording.bundled
    monkeypatch.setattr(recording, "bundled", lambda gpu: asked.append(gpu) or real(gpu))
    monkeypatch.setattr(recording, "all_bundled", lambda: pytest.fail("every GPU model's loaded"))
    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    options = parse_args(["--kernel", "naive", "--shape", "64x48x32", "--workers", "1",
                          "--db", f"sqlite:///{tmp_path / 'r.sqlite'}",
                          "--cache", str(tmp_path / "cubins")])
    evaluator, process = start_command(options)
    with evaluator:
        kill_pool(process)
        assert asked == [evaluator.info()["name"]]


def test_a_small_space_the_opening_posts_whole_is_taken_whole_by_its_study(tmp_path,
                                                                           monkeypatch):
    """Within the trial budget, the opening posts naive's whole space (48 accepted configs of
    60); the study takes every answer as a trial without asking its search for any (the model
    would only have fitted first, with the GPU idle): each accepted config stored once,
    measured once, none dropped."""
    from tuner.run.cli import parse_args
    from tuner.run.tune import start_command, tune
    from tuner.search.learned import ModelSampler
    from tuner.search.study import StudyRun

    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    url = f"sqlite:///{tmp_path / 'gemmtune.sqlite'}"
    options = parse_args(["--kernel", "naive", "--shape", "64x48x32", "--trials", "80",
                          "--patience", "2", "--workers", "2",
                          "--retime-rounds", "0", "--db", url, "--cache", str(tmp_path / "cubins")])
    accepted = NAIVE.accepted_configs("sm_90")
    taken: list[dict[str, int]] = []
    sampled: list[str] = []
    real, real_sample = StudyRun._ask_for, ModelSampler.sample_relative
    monkeypatch.setattr(StudyRun, "_ask_for",
                        lambda study, config: taken.append(config) or real(study, config))
    monkeypatch.setattr(ModelSampler, "sample_relative", lambda sampler, *args: sampled.append(
        sampler.learned.family) or real_sample(sampler, *args))
    evaluator, process = start_command(options)
    with evaluator:
        try:
            deadline = time.monotonic() + 300
            while evaluator._opening_left and time.monotonic() < deadline:
                time.sleep(0.05)  # every compile done and posted: the opening holds them all
            naive = kernels.bind(NAIVE, SMALL.layout, SMALL.batch)
            assert sorted(map(sorted, evaluator.posted(naive, SMALL))) == sorted(map(sorted, accepted))
            assert evaluator.posted(kernels.get_family("smem"), SMALL) == []
            assert tune(options, evaluator, progress=False, preparer=process) == 0
        finally:
            kill_pool(process)
        assert not evaluator._opened and evaluator.posted(naive, SMALL) == []
    assert evaluator.phases.answers == evaluator.phases.trials == len(accepted)
    database = db.open_database(url)
    try:
        (run,) = database.list_runs(family="naive")
        measured = [t.params for t in database.trials(run.id) if t.state == "ok"]
        assert sorted(map(sorted, measured)) == sorted(map(sorted, accepted))
    finally:
        database.close()
    assert sorted(map(sorted, taken)) == sorted(map(sorted, accepted))  # each taken as posted
    assert "naive" not in sampled  # its search was asked for nothing


@pytest.mark.parametrize("claims,gpu,name", [(False, None, "blocktile1d"),
                                             (True, None, "blocktile1d"),
                                             (False, "NVIDIA H200", "skinny")])
def test_a_studys_first_asks_are_posted_before_it_is_built_and_asked_by_its_search(
        tmp_path, monkeypatch, claims, gpu, name):
    """Once a study's start-up is in hand and before the study is built, its first asks after
    the warm start go to the GPU, as many as its first window holds beside the warm start: the
    static prior's ranking (the stand-in has no recordings), or the model's first picks (the
    stand-in named as the H200, whose bundled recordings of skinny it learns from). The search
    then asks each of them itself (none is taken at the end as an answer nobody asked for), and
    every config is measured once. With claims nothing more than the warm start is posted."""
    import optuna
    import tuner.run.session as session_module
    from tuner.search import space

    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    if gpu is not None:
        monkeypatch.setenv(NAME_ENV, gpu)
    events: list[tuple[str, str, list[dict[str, int]]]] = []
    real_post, real_run = LiveEvaluator.post_ahead, session_module.StudyRun

    def post(evaluator: LiveEvaluator, family, configs) -> int:
        configs = list(configs)
        events.append(("post", family.name, configs))
        return real_post(evaluator, family, configs)

    def build(session, family, problem, *args, **kwargs):
        events.append(("build", family.name, []))
        return real_run(session, family, problem, *args, **kwargs)

    monkeypatch.setattr(LiveEvaluator, "post_ahead", post)
    monkeypatch.setattr(session_module, "StudyRun", build)
    url = f"sqlite:///{tmp_path / 'gemmtune.sqlite'}"
    evaluator = _command(["--kernel", "smem", "--kernel", name, "--shape", "64x48x32",
                          "--trials", "12", "--patience", "0", "--workers", "2",
                          "--retime-rounds", "0", "--db", url, "--cache", str(tmp_path / "cubins")]
                         + (["--claim-trials"] if claims else []))
    assert evaluator.phases.answers == evaluator.phases.trials
    second = [(kind, configs) for kind, family, configs in events if family == name]
    kinds = [kind for kind, _ in second]
    # its warm start posted at the shape's start (AHEAD) and again, a no-op, as smem drains
    assert kinds == ["post", "post"] + ([] if claims else ["post"]) + ["build"]
    if claims:
        return
    warm, asks = second[0][1], second[-2][1]
    assert len(asks) == evaluator.batch - len(warm) >= 1  # (the trial budget is larger)
    assert not any(config in warm for config in asks)
    storage = optuna.storages.RDBStorage(url)
    (study,) = [s.study_name for s in optuna.get_all_study_summaries(storage)
                if name in s.study_name]
    family = kernels.get_family(name)
    trials = {config_key(space.config_from_params(family, t.params, t.distributions)): t
              for t in optuna.load_study(study_name=study, storage=storage).trials}
    assert len(trials) == evaluator.phases.trials - 3  # each config once (smem's three aside)
    for config in asks:
        trial = trials[config_key(config)]
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert not trial.user_attrs.get("posted")  # asked by the search, not taken at its end


def test_while_a_study_waits_for_compiles_a_later_studys_compiled_first_asks_are_measured(
        tmp_path, monkeypatch):
    """When a study waits for a compile with none of its candidates on the GPU, the shape's
    later studies' first configs whose compiles are done go to the GPU (no more than it takes
    at once, none while an earlier post is unanswered, and nothing compiled for them): each
    posted before its own study is built, asked by that study, measured once."""
    import optuna
    import tuner.run.session as session_module
    from tuner.search import space
    from tuner.search.prefetch import StartupPrefetch

    monkeypatch.setenv("GEMMTUNE_GPU_BACKEND", "tuner.testing")
    monkeypatch.setenv(NAME_ENV, "NVIDIA H200")  # skinny's first asks: the model's, compiled ahead
    events: list[tuple[str, str, int]] = []
    real_post, real_run = LiveEvaluator.post_compiled, session_module.StudyRun
    real_peek = StartupPrefetch.peek

    def post(evaluator: LiveEvaluator, family, configs, limit) -> int:
        building = evaluator.pool.building()[0]
        unanswered = evaluator.posted_ahead()
        posted = real_post(evaluator, family, configs, limit)
        assert unanswered == 0 and posted <= limit == evaluator.tickets
        assert evaluator.pool.building()[0] == building  # nothing compiled for them
        events.append(("post", family.name, posted))
        return posted

    def ready_peek(prefetch, family, problem):
        """As on a host with cores to spare: the start-up prepared, its first asks compiled
        ahead by the preparing process (on 2 cores both came after the study before ended)."""
        job = prefetch._jobs.get((family.name, problem))
        startup = None if job is None else job.result(timeout=120)
        if startup is not None:
            pool = prefetch.session.evaluator.pool
            bound = kernels.bind(family, problem.layout, problem.batch)
            deadline = time.monotonic() + 120
            while (not all(pool.compiled(bound, c) for c in startup.first_asks(4))
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        return real_peek(prefetch, family, problem)

    def build(session, family, problem, *args, **kwargs):
        events.append(("build", family.name, 0))
        return real_run(session, family, problem, *args, **kwargs)

    monkeypatch.setattr(LiveEvaluator, "post_compiled", post)
    monkeypatch.setattr(StartupPrefetch, "peek", ready_peek)
    monkeypatch.setattr(session_module, "StudyRun", build)
    url = f"sqlite:///{tmp_path / 'gemmtune.sqlite'}"
    families = ["smem", "blocktile1d", "skinny"]
    evaluator = _command([arg for name in families for arg in ("--kernel", name)]
                         + ["--shape", "64x48x32", "--trials", "40", "--patience", "0",
                            "--workers", "2", "--retime-rounds", "0", "--db", url,
                            "--cache", str(tmp_path / "cubins")])
    assert evaluator.phases.answers == evaluator.phases.trials
    early = {family for i, (kind, family, posted) in enumerate(events)
             if kind == "post" and posted and ("build", family, 0) not in events[:i]}
    assert early == {"skinny"}, events  # posted while blocktile1d waited
    storage = optuna.storages.RDBStorage(url)
    for name in early:
        (study,) = [s.study_name for s in optuna.get_all_study_summaries(storage)
                    if name in s.study_name]
        family = kernels.get_family(name)
        trials = optuna.load_study(study_name=study, storage=storage).trials
        keys = [config_key(space.config_from_params(family, t.params, t.distributions))
                for t in trials]
        assert len(keys) == len(set(keys))  # each config once
        assert not any(t.user_attrs.get("posted") for t in trials)  # each asked by the search
