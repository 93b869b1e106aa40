"""Smoke test of bench/search_efficiency.py: 2 seeds on a small TEST-FIXTURE recording (stand-in
model, full accepted space of naive), checking what it counts and what it writes."""

from __future__ import annotations

import gzip
import json

import pytest

import kernels

from tuner.measure.record import record_with_evaluator
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem
from bench_support import search_efficiency





def test_two_seeds_count_measured_candidates_and_write_json(tmp_path, capsys):
    naive = kernels.FAMILIES["naive"]
    recording = record_with_evaluator(StandInEvaluator(), [naive], [Problem(512, 512, 512)],
                                      max_configs=1000)
    path = recording.save(tmp_path / "fixture.json.gz")
    space = len(naive.accepted_configs())
    out = tmp_path / "se.json"
    bench = search_efficiency()
    assert bench.main(["--recording", str(path), "--seeds", "2", "--samplers", "default",
                       "random", "--workers", "1",
                       "--kernel-tuner", "none", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["seeds"] == 2 and len(document["runs"]) == 4
    for run in document["runs"]:
        # a budget of the whole space: every run gets within 1% (at worst by exhausting it)
        reached = run["reached"]
        assert 1 <= reached["5%"] <= reached["3%"] <= reached["1%"] <= run["evaluations"] <= space
        assert run["evaluations"] == reached["1%"]  # it stops on reaching the target
    rows = {r["sampler"]: r for r in document["summary"]}
    assert set(rows) == {"default", "random"} and rows["random"]["max_evals"] == space
    assert len(document["target"]) == 1
    printed = capsys.readouterr().out
    assert "within 3% (median / p90)" in printed and "target (default <= random/3 at 3%, " in printed

    # Optuna's own samplers run separately under a cap, then one table from both outputs
    capped = tmp_path / "tpe.json"
    assert bench.main(["--recording", str(path), "--seeds", "2", "--samplers", "tpe",
                       "--reference-max-evals", "3", "--workers", "1",
                       "--kernel-tuner", "none", "--out", str(capped)]) == 0
    assert {r["max_evals"] for r in json.loads(capped.read_text())["runs"]} == {3}
    merged = tmp_path / "merged.json.gz"  # gzipped by its name, and read back as merged
    assert bench.main(["--merge", str(out), str(capped), "--out", str(merged)]) == 0
    with gzip.open(merged, "rt") as file:
        combined = json.load(file)
    assert bench.read_output(merged) == combined
    assert combined["samplers"] == ["default", "random", "tpe"] and len(combined["runs"]) == 6
    assert {r["sampler"]: r["max_evals"] for r in combined["summary"]}["tpe"] == 3
    assert len(combined["target"]) == 1
    assert "'>N': not reached within N" in capsys.readouterr().out

    # Kernel Tuner's best rows from earlier outputs join the target check (--kernel-tuner-from):
    # per pair the lowest median; "not reached" (null) counts as infinite
    pair = {k: document["target"][0][k] for k in ("recording", "family", "shape")}
    default_median = document["target"][0]["default_median"]
    for median, kt_met in ((default_median * 2, True), (default_median * 2 - 1, False)):
        earlier = tmp_path / (f"kt-{median}.json" + (".gz" if kt_met else ""))
        bench.write_output(earlier, {"kernel_tuner_best": [
            {**pair, "strategy": "kt:other", "median": None, "p90": None, "runs": 2,
             "max_evals": space},
            {**pair, "strategy": "kt:pso", "median": median, "p90": median, "runs": 2,
             "max_evals": space}]})
        checked = tmp_path / f"checked-{median}.json"
        assert bench.main(["--merge", str(out), "--kernel-tuner-from", str(earlier),
                           "--out", str(checked)]) == 0
        written = json.loads(checked.read_text())
        assert written["kernel_tuner_from"] == [earlier.name]
        target = written["target"][0]
        assert (target["kt_strategy"], target["kt_met"]) == ("kt:pso", kt_met)
        assert target["all_met"] == (kt_met and target["met"] and target["p90_met"])
        assert f"default: {int(target['all_met'])} of 1 pairs meet every target checked" in (
            capsys.readouterr().out)
    with pytest.raises(SystemExit):  # not an output of this script: a clear error, no table
        bench.main(["--merge", str(out), "--kernel-tuner-from", str(path), "--out",
                    str(tmp_path / "never.json")])
    assert "--kernel-tuner-from" in capsys.readouterr().err
    assert not (tmp_path / "never.json").exists()

    # --family keeps only the named families' pairs: none of the fixture's here
    other = tmp_path / "none.json"
    assert bench.main(["--recording", str(path), "--family", "vectorized", "--samplers",
                       "random", "--workers", "1",
                       "--kernel-tuner", "none", "--out", str(other)]) == 0
    assert json.loads(other.read_text())["runs"] == []


def test_first_reach_and_percentiles():
    bench = search_efficiency()
    assert bench._first_reach([0.5, 0.96, 0.99, 1.0], 0.05) == 2
    assert bench._first_reach([0.5, 0.96, 0.99, 1.0], 0.01) == 3
    assert bench._first_reach([0.5, 0.9], 0.01) is None
    assert bench._median([1, 3, None]) == 3 and bench._percentile([1, 2, None], 0.9) == float("inf")


def test_warm_rows_start_from_the_other_problems_optima_only(tmp_path, capsys, monkeypatch):
    import db

    naive = kernels.FAMILIES["naive"]
    problems = [Problem(512, 512, 512), Problem(256, 256, 1024)]
    recording = record_with_evaluator(StandInEvaluator(), [naive], problems, max_configs=1000)
    path = str(recording.save(tmp_path / "fixture.json.gz"))
    bench = search_efficiency()

    # leave-one-out: the database of a warm run holds the other problem's optimum, not its own
    bench._worker_state(path)
    job = bench.Job(path, "naive", problems[0], bench.WARM, 0, 10, (path,))
    with db.open_database(f"sqlite:///{tmp_path / 'warm.sqlite'}") as database:
        info = StandInEvaluator().info()
        bench._seed_other_optima(database, job, info)
        stored = {(p.m, p.n, p.k) for p in database.list_problems()}
        assert stored == {(256, 256, 1024)}
        best = database.best(info["name"], 256, 256, 1024, family="naive", nearest=False)
        assert best.params == recording.optimum("naive", problems[1])[0]

    # the default's warm row: the model (learning from the other problem only), warm-started
    from tuner.search import study as study_module

    sessions = []
    real = study_module.run_study

    def spy(session, *args, **kwargs):
        sessions.append(session)
        return real(session, *args, **kwargs)

    monkeypatch.setattr(study_module, "run_study", spy)
    row = bench.run_one(bench.Job(path, "naive", problems[0], bench.DEFAULT_WARM, 0, 10, (path,)))
    monkeypatch.undo()
    [session] = sessions
    assert row["sampler"] == bench.DEFAULT_WARM and session.sampler == "default"
    assert session.warm_start and {e.problem for e in session.training} == {problems[1]}

    out = tmp_path / "warm.json"
    assert bench.main(["--recording", path, "--seeds", "2", "--samplers", "default", "random",
                       "--warm-start", "--workers", "1",
                       "--kernel-tuner", "none", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert {r["sampler"] for r in document["summary"]} == {"default", "random", bench.WARM,
                                                          bench.DEFAULT_WARM}
    assert {c["sampler"] for c in document["target"]} == {"default", bench.WARM, bench.DEFAULT_WARM}
    assert f"target ({bench.WARM} <= random/3 at 3%, " in capsys.readouterr().out


def test_prior_compiles_reaches_the_replayed_prior(tmp_path, monkeypatch):
    """``--prior-compiles N`` is the bound the replayed study's static prior ranks with (a
    replay reads the recorded resources instead of compiling)."""
    from tuner.search import prior

    naive = kernels.FAMILIES["naive"]
    problem = Problem(512, 512, 512)
    recording = record_with_evaluator(StandInEvaluator(), [naive], [problem], max_configs=1000)
    path = str(recording.save(tmp_path / "fixture.json.gz"))
    bench = search_efficiency()
    bounds: list[int] = []
    rank = prior.startup_configs

    def recorded(*args, **kwargs):
        bounds.append(args[9] if len(args) > 9 else kwargs["max_compiles"])
        return rank(*args, **kwargs)

    monkeypatch.setattr(prior, "startup_configs", recorded)
    bench.run_one(bench.Job(path, "naive", problem, "default", 0, 10, prior_compiles=5))
    bench.run_one(bench.Job(path, "naive", problem, "default", 0, 10))
    assert bounds == [5, prior.MAX_COMPILES]
    out = tmp_path / "se.json"
    assert bench.main(["--recording", path, "--seeds", "1", "--samplers", "default",
                       "--prior-compiles", "5", "--workers", "1", "--kernel-tuner", "none",
                       "--out", str(out)]) == 0
    assert json.loads(out.read_text())["prior_compiles"] == 5


def test_runs_split_by_first_seed_merge_into_the_rows_of_one_run(tmp_path, capsys):
    """--first-seed 1 --seeds 1 plus --seeds 1 gives the runs of --seeds 2; a seed in two merged
    outputs is refused, and nothing is written."""
    naive = kernels.FAMILIES["naive"]
    recording = record_with_evaluator(StandInEvaluator(), [naive], [Problem(96, 80, 64)],
                                      max_configs=1000)
    path = str(recording.save(tmp_path / "fixture.json.gz"))
    bench = search_efficiency()
    common = ["--recording", path, "--samplers", "default", "random", "--workers", "1",
              "--kernel-tuner", "none"]
    outs = {name: tmp_path / f"{name}.json" for name in ("both", "first", "second", "merged")}
    assert bench.main([*common, "--seeds", "2", "--out", str(outs["both"])]) == 0
    assert bench.main([*common, "--seeds", "1", "--out", str(outs["first"])]) == 0
    assert bench.main([*common, "--seeds", "1", "--first-seed", "1",
                       "--out", str(outs["second"])]) == 0
    assert bench.main(["--merge", str(outs["first"]), str(outs["second"]),
                       "--out", str(outs["merged"])]) == 0
    both, merged = (json.loads(outs[n].read_text()) for n in ("both", "merged"))

    def runs(document):
        return sorted((r["sampler"], r["seed"], r["evaluations"], r["reached"]["3%"])
                      for r in document["runs"])
    assert runs(merged) == runs(both) and {r["seed"] for r in both["runs"]} == {0, 1}

    def rows(document):  # (the seconds a run took differ)
        return [{k: v for k, v in row.items() if k != "seconds_per_run"}
                for row in document["summary"]]
    assert merged["seeds"] == 2 and rows(merged) == rows(both)
    capsys.readouterr()
    with pytest.raises(SystemExit, match="more than one output"):
        bench.main(["--merge", str(outs["first"]), str(outs["both"]),
                    "--out", str(tmp_path / "never.json")])
    assert not (tmp_path / "never.json").exists()


def test_merge_samplers_keeps_only_the_named_samplers_runs(tmp_path, capsys):
    """--merge-samplers cuts every merged output to the named samplers' runs and notes (a
    failure note of a dropped sampler goes with it); a name with no run, or the option without
    --merge, is a clear error that writes nothing."""
    naive = kernels.FAMILIES["naive"]
    recording = record_with_evaluator(StandInEvaluator(), [naive], [Problem(96, 80, 64)],
                                      max_configs=1000)
    path = str(recording.save(tmp_path / "fixture.json.gz"))
    bench = search_efficiency()
    both = tmp_path / "both.json"
    assert bench.main(["--recording", path, "--samplers", "default", "random", "--seeds", "2",
                       "--workers", "1", "--kernel-tuner", "none", "--out", str(both)]) == 0
    noted = tmp_path / "noted.json"  # as a random + Kernel Tuner output with a failed strategy
    bench.write_output(noted, {**json.loads(both.read_text()),
                               "failed_samplers": {"kt:skopt": "needs skopt"}})
    kept = tmp_path / "kept.json"
    assert bench.main(["--merge", str(noted), "--merge-samplers", "random",
                       "--out", str(kept)]) == 0
    document = json.loads(kept.read_text())
    assert {r["sampler"] for r in document["runs"]} == {"random"} and len(document["runs"]) == 2
    assert document["samplers"] == ["random"] and document["failed_samplers"] == {}
    assert document["target"] == []  # no default row left to check
    capsys.readouterr()
    for argv, message in ((["--merge", str(both), "--merge-samplers", "tpe"], "no run of tpe"),
                          (["--merge-samplers", "random"], "needs --merge")):
        with pytest.raises(SystemExit) as stopped:  # merge's own message, or argparse's
            bench.main([*argv, "--out", str(tmp_path / "never.json")])
        assert message in f"{stopped.value.code} {capsys.readouterr().err}"
        assert not (tmp_path / "never.json").exists()


def test_merge_recordings_keeps_only_the_named_recordings_runs(tmp_path, capsys):
    """--merge-recordings cuts the merged runs and the --kernel-tuner-from rows to the named
    recordings (by file name, so a recording removed from the tree leaves the table) and says
    what it left out; a name no output holds, or the option without --merge, is a clear error
    that writes nothing."""
    naive = kernels.FAMILIES["naive"]
    bench = search_efficiency()
    outputs = []
    for name, shape in (("kept", (96, 80, 64)), ("gone", (64, 48, 32))):
        recording = record_with_evaluator(StandInEvaluator(), [naive], [Problem(*shape)],
                                          max_configs=1000)
        path = str(recording.save(tmp_path / f"{name}.json.gz"))
        out = tmp_path / f"{name}.json"
        assert bench.main(["--recording", path, "--samplers", "default", "random", "--seeds",
                           "2", "--workers", "1", "--kernel-tuner", "none",
                           "--out", str(out)]) == 0
        outputs.append(str(out))
    # as an earlier Kernel Tuner output: a best strategy row for each recording
    kt = tmp_path / "kt.json"
    bench.write_output(kt, {**json.loads(open(outputs[0]).read()), "kernel_tuner_best": [
        {"recording": f"{name}.json.gz", "family": "naive", "shape": shape, "strategy": "kt:mls",
         "median": 30, "p90": 40, "runs": 2, "max_evals": 99}
        for name, shape in (("kept", "96x80x64"), ("gone", "64x48x32"))]})
    merged = tmp_path / "merged.json"
    capsys.readouterr()
    assert bench.main(["--merge", *outputs, "--merge-recordings",
                       str(tmp_path / "kept.json.gz"), "--kernel-tuner-from", str(kt),
                       "--out", str(merged)]) == 0
    assert "left out the runs of 1 recording(s) not named: gone.json.gz" in capsys.readouterr().err
    document = json.loads(merged.read_text())
    assert {r["recording"] for r in document["runs"]} == {"kept.json.gz"}
    assert len(document["runs"]) == 4 and document["recordings"] == ["kept.json.gz"]
    assert [r["recording"] for r in document["kernel_tuner_best"]] == ["kept.json.gz"]
    assert [t["recording"] for t in document["target"]] == ["kept.json.gz"]
    everything = tmp_path / "everything.json"
    assert bench.main(["--merge", *outputs, "--out", str(everything)]) == 0
    assert len(json.loads(everything.read_text())["runs"]) == 8  # default: every run
    for argv, message in ((["--merge", *outputs, "--merge-recordings", "typo.json.gz"],
                           "no run of typo.json.gz"),
                          (["--merge-recordings", "kept.json.gz"], "needs --merge")):
        with pytest.raises(SystemExit) as stopped:
            bench.main([*argv, "--out", str(tmp_path / "never.json")])
        assert message in f"{stopped.value.code} {capsys.readouterr().err}"
        assert not (tmp_path / "never.json").exists()


def _runs(recording: str, family: str, shape: str, medians: dict[str, int]) -> list[dict]:
    """Two seeds of a row per sampler, as this script writes them, reaching 3 % at the given
    counts."""
    return [{"recording": recording, "family": family, "shape": shape, "sampler": sampler,
             "seed": seed, "batch": 1, "evaluations": count, "max_evals": 400, "asked": count,
             "seconds": 0.1, "reached": {"1%": count, "3%": count, "5%": count}}
            for sampler, count in medians.items() for seed in (0, 1)]


def test_outputs_that_name_a_bundled_recording_by_an_old_name_merge_under_its_current_one(
        tmp_path, capsys):
    """Outputs written before the bundled recordings were renamed key their runs and Kernel
    Tuner rows by the old file names: --merge, --merge-recordings (old or new names) and
    --kernel-tuner-from resolve them through the manifest, so they join the rows of the file
    under its current name; a best Kernel Tuner row an earlier merge took from another output
    keeps that output's name."""
    from tuner.measure.recording import canonical_name

    bench = search_efficiency()
    old, shape = "h100-splitk.json.gz", "256x256x16384"
    new = canonical_name(old)
    assert new == "h100-splitk-256x256x16384+512x384x8192.json.gz"
    earlier = tmp_path / "earlier.json"
    bench.write_output(earlier, {
        "seeds": 2, "samplers": ["default", "random"], "recordings": [old], "seconds": 1.0,
        "runs": _runs(old, "splitk", shape, {"default": 3, "random": 60}),
        "kernel_tuner_best": [{"recording": old, "family": "splitk", "shape": shape,
                               "strategy": "kt:mls", "median": 10, "p90": 12, "runs": 20,
                               "max_evals": 474, "from": "search_efficiency-kt.json.gz"}]})
    for named in (old, new):
        merged = tmp_path / "merged.json"
        assert bench.main(["--merge", str(earlier), "--kernel-tuner-from", str(earlier),
                           "--merge-recordings", f"tuner/recordings/{named}",
                           "--out", str(merged)]) == 0
        document = json.loads(merged.read_text())
        assert {r["recording"] for r in document["runs"]} == {new}
        assert document["recordings"] == [new]
        [check] = document["target"]
        assert (check["recording"], check["kt_median"], check["all_met"]) == (new, 10, True)
        assert document["kernel_tuner_best"][0]["from"] == "search_efficiency-kt.json.gz"
        assert "default: 1 of 1 pairs meet every target checked" in capsys.readouterr().out
    # the prior's design recordings stay in-sample under either name
    assert bench.fit_kind("default", "h100-warptile-vectorized.json.gz") == "in-sample"
    assert bench.fit_kind("default", bench.DESIGN_RECORDINGS[1]) == "in-sample"
    assert bench.fit_kind("default", new) == "leave-one-out"


def test_a_recording_named_by_an_old_name_is_searched_under_its_current_one():
    """``--recording`` / ``--learn-from`` with a bundled recording's old name plan the same
    runs as with its current name, keyed by the current one (one file, loaded once)."""
    from tuner.measure.recording import BUNDLED_RECORDINGS

    bench = search_efficiency()
    args = bench.arguments().parse_args(["--samplers", "default", "--seeds", "1"])
    old = str(BUNDLED_RECORDINGS / "h100-tf32x3-kheavy.json.gz")
    new = str(BUNDLED_RECORDINGS / "h100-tf32x3-256x256x16384.json.gz")
    jobs, caps, _ = bench.plan([old], ["default"], args, learn_from=[new])
    assert list(caps) == [("h100-tf32x3-256x256x16384.json.gz", "tf32x3", "256x256x16384")]
    assert [j.recording for j in jobs] == [new] and jobs[0].others == (new,)


def test_the_kept_table_gives_the_verdict_the_docs_cite(tmp_path, capsys):
    """bench/results/search_efficiency-table.json.gz holds the default's and random's runs and
    the best Kernel Tuner row per pair: re-read with the command of docs/search.md ("Today's
    table"), it names every bundled recording and gives 269 of 272, all leave-one-out pairs
    met (a recording bundled without its rows in the table fails here: --merge-recordings)."""
    from pathlib import Path

    from tuner.measure.recording import BUNDLED_RECORDINGS

    bench = search_efficiency()
    table = Path(__file__).resolve().parents[1] / "bench/results/search_efficiency-table.json.gz"
    out = tmp_path / "table.json"
    assert bench.main(["--merge", str(table), "--kernel-tuner-from", str(table),
                       "--merge-recordings", *map(str, BUNDLED_RECORDINGS.glob("*.json.gz")),
                       "--out", str(out)]) == 0
    assert "default: 269 of 272 pairs meet every target checked" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert len(document["kernel_tuner_best"]) == 272
    assert all(c["all_met"] for c in document["target"] if c["fit"] == "leave-one-out")
