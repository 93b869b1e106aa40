"""Opening a database: URL choice, first-use creation and migration, refusing what is not ours."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

import db
from db.models import Base
from db.schema import VERSION_TABLE, head_revision, is_ours
from db.testing import BACKENDS, PG_MISSING, PG_URL_ENV, postgres_available, scratch_url

GPU = db.GpuInfo("NVIDIA H100", "GPU-1", "9.0", 132, 80 * 2**30)


@pytest.fixture(params=[pytest.param(b, marks=[pytest.mark.postgres] if b == "postgresql" else [])
                        for b in BACKENDS])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql" and not postgres_available():
        pytest.skip(PG_MISSING)
    with scratch_url(request.param, tmp_path) as scratch:
        yield scratch


def raw_engine(url: str):
    """A plain engine (no gemmtune migration) to inspect or tamper with the database."""
    return create_engine(db.resolve_url(url))


# ---------------------------------------------------------------- which database


def test_url_comes_from_argument_then_environment_then_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("GEMMTUNE_DB", raising=False)
    default_file = tmp_path / "data" / "gemmtune" / "gemmtune.sqlite"
    assert db.default_url() == f"sqlite:///{default_file}"
    assert db.resolve_url() == db.default_url()

    monkeypatch.setenv("GEMMTUNE_DB", "sqlite:////srv/results.sqlite")
    assert db.resolve_url() == "sqlite:////srv/results.sqlite"
    assert db.resolve_url("sqlite:////elsewhere.sqlite") == "sqlite:////elsewhere.sqlite"
    assert db.resolve_url(str(tmp_path / "bare.sqlite")) == f"sqlite:///{tmp_path}/bare.sqlite"
    assert db.resolve_url("postgresql://u:p@host:5433/results") == (
        "postgresql+psycopg://u:p@host:5433/results")
    assert db.resolve_url("postgres://u@host/results") == "postgresql+psycopg://u@host/results"


def test_default_file_and_its_folder_are_created_on_first_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "fresh"))
    monkeypatch.delenv("GEMMTUNE_DB", raising=False)
    default_file = tmp_path / "fresh" / "gemmtune" / "gemmtune.sqlite"
    assert not default_file.parent.exists()
    with db.open_database() as database:
        database.ensure_gpu(GPU)
    assert default_file.is_file()
    with db.open_database(f"sqlite:///{default_file}") as again:
        assert [g.uuid for g in again.list_gpus()] == ["GPU-1"]


def test_sqlite_is_in_wal_mode_with_a_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "wal.sqlite"
    with db.open_database(f"sqlite:///{path}") as database:
        with database._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    # WAL is a property of the file: any other client sees it too.
    with sqlite3.connect(path) as plain:
        assert plain.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ---------------------------------------------------------------- schema


def test_schema_is_created_at_head_and_reopening_is_a_no_op(url: str) -> None:
    with db.open_database(url) as database:
        run_gpu = database.ensure_gpu(GPU)
    with db.open_database(url) as database:
        assert database.ensure_gpu(GPU) == run_gpu
    engine = raw_engine(url)
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        version = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    engine.dispose()
    assert {"gt_gpus", "gt_problems", "gt_families", "gt_runs", "gt_trials", "gt_baselines",
            VERSION_TABLE} <= tables
    assert all(is_ours(t) for t in tables)
    assert version == [head_revision()]


def test_migrations_build_exactly_the_models(url: str) -> None:
    db.open_database(url).close()
    engine = raw_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "compare_type": True, "version_table": VERSION_TABLE,
            "include_name": lambda name, kind, _: kind != "table" or is_ours(name)})
        differences = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert differences == []


def test_a_database_from_before_layouts_is_migrated_and_keeps_its_results(url: str) -> None:
    """A schema at revision 0003 (problems and jobs spelled "row-major", no batch) opens as
    layout "nn", batch 1, with its rows and their ids intact; batched and other-layout problems
    then sit beside them."""
    from alembic import command

    from db.schema import alembic_config

    engine = raw_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0003_jobs")
        conn.execute(text("INSERT INTO gt_gpus (name, uuid, compute_capability, sm_count, memory_bytes, first_seen) "
                          "VALUES ('NVIDIA H100', 'GPU-1', '9.0', 132, 1, CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO gt_problems (m, n, k, dtype, layout, general_alpha_beta) "
                          "VALUES (1024, 512, 256, 'fp32', 'row-major', true)"))
        conn.execute(text("INSERT INTO gt_jobs (gpu_name, m, n, k, dtype, layout, general_alpha_beta, families, "
                          "budget, origin, state, attempts, run_ids, created_at) VALUES ('NVIDIA H100', 1024, 512, "
                          "256, 'fp32', 'row-major', true, '[]', '{}', 'request', 'queued', 0, '[]', CURRENT_TIMESTAMP)"))
        old_id = conn.execute(text("SELECT id FROM gt_problems")).scalar()
    engine.dispose()
    with db.open_database(url) as database:
        assert database.ensure_problem(1024, 512, 256) == old_id  # "nn", batch 1: the old row
        job = database.list_jobs()[0]
        assert (job.layout, job.batch, job.label) == ("nn", 1, "1024x512x256")
        batched = database.ensure_problem(512, 512, 64, layout="nt", batch=128)
        assert batched != old_id and database.ensure_problem(512, 512, 64, layout="nt", batch=128) == batched
        assert database.ensure_problem(1024, 512, 256, layout="nt") not in (old_id, batched)
        with pytest.raises(db.InvalidInputError, match="layout"):
            database.ensure_problem(1024, 512, 256, layout="row-major")
        with pytest.raises(db.InvalidInputError, match="batch"):
            database.ensure_problem(1024, 512, 256, batch=0)


def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    content = b"these are my notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(db.NotADatabaseError) as caught:
        db.open_database(f"sqlite:///{path}")
    assert str(path) in str(caught.value) and "not a SQLite database" in str(caught.value)
    assert isinstance(caught.value, db.StorageError)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.sqlite"]


def test_a_newer_schema_is_refused_and_kept(url: str) -> None:
    with db.open_database(url) as database:
        database.ensure_gpu(GPU)
    engine = raw_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'f00dcafe9999'"))
    with pytest.raises(db.SchemaTooNewError) as caught:
        db.open_database(url)
    message = str(caught.value)
    assert "'f00dcafe9999'" in message and head_revision() in message
    assert "newer gemmtune" in message
    assert url.split("@")[-1].split("/")[-1] in message  # names the file / database
    with engine.connect() as conn:
        assert conn.execute(text("SELECT uuid FROM gt_gpus")).scalars().all() == ["GPU-1"]
        assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == (
            "f00dcafe9999")
    engine.dispose()


def test_our_tables_without_a_version_record_are_refused(url: str) -> None:
    with db.open_database(url) as database:
        database.ensure_gpu(GPU)
    engine = raw_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
    with pytest.raises(db.StorageError, match="gt_gpus.*no gt_alembic_version"):
        db.open_database(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gt_gpus")).scalar() == 1
    engine.dispose()


# ---------------------------------------------------------------- Optuna beside us


@pytest.mark.parametrize("optuna_first", [True, False], ids=["optuna-first", "gemmtune-first"])
def test_optuna_storage_shares_the_database(url: str, optuna_first: bool) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage_url = db.resolve_url(url)  # Optuna needs the psycopg driver spelled out too

    def tune_a_little() -> None:
        storage = optuna.storages.RDBStorage(storage_url)
        study = optuna.create_study(study_name="warptile-h100", storage=storage,
                                    load_if_exists=True)
        study.optimize(lambda t: (t.suggest_int("BM", 16, 256) - 64) ** 2, n_trials=3)
        storage.engine.dispose()

    if optuna_first:
        tune_a_little()
    with db.open_database(url) as database:
        gpu_id = database.ensure_gpu(GPU)
    if not optuna_first:
        tune_a_little()
    tune_a_little()  # Optuna reopens a database that holds our tables
    with db.open_database(url) as database:  # and we reopen one that holds Optuna's
        assert database.ensure_gpu(GPU) == gpu_id

    engine = raw_engine(url)
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        optuna_version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        ours = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    engine.dispose()
    assert {"studies", "trials", "alembic_version", "gt_trials", VERSION_TABLE} <= tables
    assert ours == head_revision() and optuna_version != ours
    study = optuna.load_study(study_name="warptile-h100", storage=storage_url)
    assert len(study.trials) == 6


def test_an_unreachable_database_is_a_storage_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(db.StorageError) as caught:
        db.open_database("postgresql://nobody:secret@127.0.0.1:1/results?connect_timeout=2")
    message = str(caught.value)
    assert "cannot open postgresql+psycopg://nobody:***@127.0.0.1:1/results" in message
    assert "secret" not in message
    folder = tmp_path / "a-folder.sqlite"
    folder.mkdir()
    with pytest.raises(db.StorageError, match="a-folder.sqlite"):
        db.open_database(f"sqlite:///{folder}")


@pytest.mark.postgres
def test_a_scratch_database_still_held_by_sessions_is_dropped(tmp_path: Path) -> None:
    # The teardown must not need superuser rights (CI's role has none) nor fail on open sessions.
    if not postgres_available():
        pytest.skip(PG_MISSING)
    import psycopg
    from sqlalchemy.engine import make_url

    with scratch_url("postgresql", tmp_path) as scratch:
        url = make_url(scratch)
        held = psycopg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
        held.execute("SELECT 1")
    with psycopg.connect(os.environ[PG_URL_ENV]) as admin:
        left = admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                             (url.database,)).fetchone()
    held.close()
    assert left == (0,)
