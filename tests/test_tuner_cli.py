"""``python -m tuner`` on CPU: option parsing and its errors, no-GPU behaviour, --dry-run with
real NVRTC, and a whole tuning command through the stand-in evaluator into real SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import db
import kernels
import pytest

from tuner.measure.testing import StandInEvaluator
from tuner.problem import DEFAULT_SHAPES, Problem
from tuner.run.cli import parse_args
from tuner.run.options import DEFAULT_TOTAL_SECONDS
from tuner.run.tune import tune
from tuner.search.choices import missing_packages

ROOT = Path(__file__).resolve().parents[1]


def run_tuner(*args: str, env: dict[str, str] | None = None, timeout: float = 120
              ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def isolated_env(tmp_path: Path) -> dict[str, str]:
    """Defaults pointed into tmp_path, so a test can see whether anything was stored."""
    return {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "GEMMTUNE_DB": "",
            "GEMMTUNE_STORAGE": "", "GEMMTUNE_CACHE": ""}


def test_help_explains_every_option():
    result = run_tuner("--help")
    assert result.returncode == 0
    for option in ("--gpu", "--gpus", "--kernel", "--shape", "--trials", "--timeout", "--budget", "--patience",
                   "--sampler", "--seed", "--db", "--storage", "--cache", "--dry-run",
                   "--verbose", "tpe", "cmaes", "random", "default"):
        assert option in result.stdout
    for problem in DEFAULT_SHAPES:
        assert problem.shape in result.stdout


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["--shape", "1024x1024"], ["'1024x1024'", "MxNxK", "positive integers"]),
        (["--shape", "axbxc"], ["'axbxc'", "MxNxK"]),
        (["--shape", "0x16x16"], ["M=0", "positive integer"]),
        (["--shape", "16x16x-3"], ["K=-3", "positive integer"]),
        (["--shape", "16x16x16:xy"], ["'xy'", "nn, nt, tn, tt"]),
        (["--shape", "0x16x16x16:nt"], ["B=0", "positive integer"]),
        (["--kernel", "fastest"], ["'fastest'", *kernels.FAMILIES]),
        (["--trials", "0"], ["--trials", "positive integer"]),
        (["--timeout", "-5"], ["--timeout", "positive"]),
        (["--budget", "0"], ["--budget", "positive"]),
        (["--budget", "60", "--timeout", "5"], ["--timeout", "not allowed with", "--budget"]),
        (["--patience", "-1"], ["--patience", "0 or more"]),
        (["--sampler", "annealing"], ["annealing", "tpe", "gp", "cmaes", "random"]),
        (["--gpus", "0,0"], ["'0,0'", "distinct", "'all'"]),
        (["--gpus", "first"], ["'first'", "0,1", "'all'"]),
        (["--gpu", "1", "--gpus", "0,1"], ["--gpus", "not allowed with", "--gpu"]),
    ],
)
def test_bad_input_exits_2_naming_what_was_wrong_and_what_is_allowed(argv, wanted, capsys):
    assert_refused(argv, wanted, capsys)


def assert_refused(argv: list[str], wanted: list[str], capsys) -> None:
    """parse_args exits 2 with every text of ``wanted`` on stderr."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    for text in wanted:
        assert text in message


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        # found live: it used to fail with a traceback at splitk's study, the others tuned
        (["--sampler", "model", "--kernel", "naive", "--kernel", "splitk"],
         ["'model'", "splitk has more than 1,000,000 configs", "--kernel", "naive, smem",
          "--sampler default"]),
        (["--sampler", "model"], ["splitk has more than"]),
    ],
)
def test_the_model_sampler_on_a_space_too_large_to_list_is_refused(argv, wanted, capsys, monkeypatch):
    import tuner.search.study as study_module

    # every registered family is listed under the shipped limit; under this one split-K's
    # 4.4M-config product is not
    monkeypatch.setattr(study_module, "ENUMERABLE_SPACE", 1_000_000)
    assert_refused(argv, wanted, capsys)


def test_every_registered_family_is_listed_for_the_default_sampler():
    from tuner.search.study import enumerable

    assert [f.name for f in kernels.FAMILIES.values() if not enumerable(f)] == []


def test_a_sampler_whose_packages_are_missing_is_refused(capsys):
    missing = missing_packages("gp")
    if not missing:
        pytest.skip("torch and scipy are installed here")
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--sampler", "gp"])
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert "'gp'" in message and all(package in message for package in missing)


def test_the_model_sampler_takes_families_whose_space_is_listed():
    args = parse_args(["--sampler", "model", "--kernel", "naive", "--kernel", "wgmma"])
    assert [f.name for f in args.families] == ["naive", "wgmma"]


def test_defaults_and_repeated_options():
    args = parse_args([])
    assert args.problems == list(DEFAULT_SHAPES)
    assert [f.name for f in args.families] == list(kernels.FAMILIES)
    args = parse_args(["--kernel", "smem", "--kernel", "naive", "--kernel", "smem",
                       "--shape", "8x16x32", "--shape", "1023X1025X999"])
    assert [f.name for f in args.families] == ["smem", "naive"]
    assert args.problems == [Problem(8, 16, 32), Problem(1023, 1025, 999)]


def test_budget_is_the_time_the_studies_share_and_timeout_bounds_each_instead():
    assert parse_args([]).budget.total_seconds() == DEFAULT_TOTAL_SECONDS
    assert parse_args(["--budget", "420"]).budget.total_seconds() == 420
    timed = parse_args(["--timeout", "9"]).budget
    assert timed.total_seconds() is None and timed.study_budget().timeout_s == 9


def test_the_commands_stale_after_default_is_the_databases():
    import db
    from tuner.run.options import DEFAULT_STALE_AFTER_S

    assert DEFAULT_STALE_AFTER_S == db.DEFAULT_STALE_AFTER_S


def test_the_command_parses_before_the_heavy_imports():
    """A live run starts its GPU process after parsing and imports Optuna and SQLAlchemy while
    that process starts CUDA (tuner.run.tune.live_main): parsing must not import them."""
    probe = ("import sys; from tuner.run.cli import parse_args; import tuner.run.tune; "
             "parse_args(['--shape', '64x64x64', '--kernel', 'naive']); "
             "print(sorted(m for m in ('optuna', 'sqlalchemy', 'db', 'sklearn') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bad_input_through_the_command_stores_nothing(tmp_path):
    result = run_tuner("--shape", "64x64", env=isolated_env(tmp_path))
    assert result.returncode == 2 and "MxNxK" in result.stderr
    assert not (tmp_path / "data").exists()


def test_without_a_gpu_the_command_says_so_and_stores_nothing(tmp_path):
    from tuner.measure.gpu import probe

    if probe() is None:
        pytest.skip("this machine has a usable GPU")
    result = run_tuner("--shape", "64x64x64", "--kernel", "naive", env=isolated_env(tmp_path))
    assert result.returncode == 1
    assert "no usable GPU 0" in result.stderr and "--dry-run" in result.stderr
    assert not (tmp_path / "data").exists()


def test_dry_run_compiles_and_reports_resources_without_gpu_or_database(tmp_path):
    env = isolated_env(tmp_path)
    argv = ("--dry-run", "--kernel", "naive", "--kernel", "vectorized", "--dry-run-configs", "2",
            "--seed", "7", "--cache", str(tmp_path / "cubins"))
    first = run_tuner(*argv, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    for family in ("naive", "vectorized"):
        assert f"\n{family} (source {kernels.FAMILIES[family].source_hash[:12]}, sm_90" in out
    assert out.count("registers  shared B  spill B  occupancy") == 2
    rows = [line for line in out.splitlines() if line.startswith(("BX=", "BM="))]
    assert len(rows) == 4
    for row in rows:
        registers, shared, spills, occupancy = row.split()[-5:-1]
        assert int(registers) > 0 and int(shared) >= 0 and int(spills) >= 0
        assert 0 < float(occupancy) <= 1
    assert any((tmp_path / "cubins").iterdir())
    assert not (tmp_path / "data").exists()
    again = run_tuner(*argv, env=env, timeout=300)  # same seed: same configs, from the cache
    assert again.returncode == 0 and again.stdout == out


def test_a_tuning_command_stores_runs_and_prints_the_table_then_resumes(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    base = ["--kernel", "naive", "--kernel", "smem", "--shape", "128x128x128", "--db", url]
    argv = [*base, "--trials", "4"]
    evaluator = StandInEvaluator()
    assert tune(parse_args(argv), evaluator, progress=False) == 0
    table = capsys.readouterr().out
    assert "Best kernel per shape" in table and "128x128x128" in table
    with db.open_database(url) as database:
        runs = database.list_runs()
        assert {r.family for r in runs} == {"naive", "smem"}
        assert all(r.state == "finished" and r.command.startswith("python -m tuner --kernel")
                   for r in runs)
        best = database.best(evaluator.gpu_name, 128, 128, 128, nearest=False)
        assert best is not None and best.fraction_of_cublas is not None
        assert f"{best.gflops:,.0f}" in table and f"{best.fraction_of_cublas:.2f}" in table

    # the same command again: the studies are resumed from the same database (the default
    # Optuna storage) and the budget is already spent, so nothing is measured twice
    again = StandInEvaluator()
    assert tune(parse_args(argv), again, progress=False) == 0
    assert again.calls == []
    # a bigger budget continues them
    assert tune(parse_args([*base, "--trials", "6"]), again, progress=False) == 0
    assert len(again.calls) == 2  # naive gains two; smem's 3 configs were all measured
    measured = {tuple(sorted(c.items())) for _, c, _ in evaluator.calls}
    assert not measured & {tuple(sorted(c.items())) for _, c, _ in again.calls}


def test_a_results_database_that_is_not_one_is_refused_and_left_alone(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n")
    code = tune(parse_args(["--kernel", "smem", "--db", f"sqlite:///{path}"]), StandInEvaluator(),
                progress=False)
    assert code == 2 and "cannot use the results database" in capsys.readouterr().err
    assert path.read_text() == "not a database\n"


def test_a_separate_optuna_storage_holds_the_studies(tmp_path, capsys):
    import optuna

    results, studies = tmp_path / "results.sqlite", tmp_path / "studies.sqlite"
    argv = ["--kernel", "smem", "--shape", "64x64x64", "--db", str(results),
            "--storage", f"sqlite:///{studies}"]
    assert tune(parse_args(argv), StandInEvaluator(), progress=False) == 0
    names = optuna.get_all_study_names(f"sqlite:///{studies}")
    assert len(names) == 1 and "/smem@" in names[0]
    assert names[0].endswith("/64x64x64/fp32/nn")
    with db.open_database(str(results)) as database:
        assert [run.study_name for run in database.list_runs()] == names


def test_ctrl_c_on_the_whole_command_stops_between_trials_and_marks_the_run(tmp_path):
    """The real command in its own process group, as in a terminal: Ctrl-C reaches the parent,
    the compile workers and the GPU child alike; only the parent may act on it. The GPU child
    runs the CPU stand-in bench (GEMMTUNE_GPU_BACKEND), compiles are real NVRTC."""
    import signal

    results = tmp_path / "results.sqlite"
    env = {**isolated_env(tmp_path), "GEMMTUNE_GPU_BACKEND": "tuner.testing",
           "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "--kernel", "naive", "--shape", "96x64x32",
         "--trials", "40", "--workers", "2", "--db", str(results), "-v"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        for line in process.stderr:
            if " ok " in line and "trial " in line:  # the first measured trial
                os.killpg(process.pid, signal.SIGINT)
                break
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "SIGINT: stopping after the current trial" in err
    assert "Best kernel per shape (interrupted)" in out
    with db.open_database(str(results)) as database:
        (run,) = database.list_runs()
        assert run.state == "interrupted" and 1 <= run.n_ok < 40
        assert all(t.state in ("ok", "rejected") for t in database.run_history(run.id))


def test_the_start_up_prior_compiles_into_the_cache_folder_given(tmp_path, monkeypatch):
    # The default sampler's static prior compiles its candidates (tuner.search.prior); with --cache
    # they belong in that folder, not in the kernels' default one.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GEMMTUNE_CACHE", "")
    cache = tmp_path / "cubins"
    argv = ["--kernel", "blocktile1d", "--shape", "256x256x256", "--trials", "2",
            "--db", f"sqlite:///{tmp_path / 'results.sqlite'}", "--cache", str(cache)]
    evaluator = StandInEvaluator()
    assert tune(parse_args(argv), evaluator, progress=False) == 0
    cached = [p for p in cache.rglob("*") if p.is_file()]
    assert len(cached) > len(evaluator.calls), "the prior's compiles did not reach --cache"
    assert not [p for p in (tmp_path / "xdg").rglob("*") if p.is_file()]


def test_all_gpus_of_a_host_tune_as_one_search(tmp_path):
    """--gpus all on the stand-in driver's two GPUs: one command, one run, its budget measured
    once between them (real NVRTC compiles, a stand-in GPU child per device)."""
    results = tmp_path / "results.sqlite"
    env = {**isolated_env(tmp_path), "GEMMTUNE_GPU_BACKEND": "tuner.testing", "GEMMTUNE_STANDIN_GPUS": "2"}
    result = run_tuner("--gpus", "all", "--kernel", "naive", "--shape", "96x64x32", "--trials", "6",
                       "--workers", "2", "--db", str(results), env=env, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "2 GPUs (0, 1; " in result.stderr and "measure for one search" in result.stderr
    assert "Best kernel per shape" in result.stdout
    with db.open_database(str(results)) as database:
        (run,) = database.list_runs()
        assert run.state == "finished" and run.n_ok == 6
