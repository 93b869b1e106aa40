"""db: best/nearest/top-k/overview restricted to sets of families or versions, and the in-memory
table (best_table + change_marker) the API answers /api/best from. Real SQLite files."""

from __future__ import annotations

import hashlib

import db
import kernels
import pytest
from results_support import CONFIGS, H100, Row, fill

OLD = hashlib.sha256(b"an older naive.cu").hexdigest()
SQUARE, OTHER, FAR = (1024, 1024, 1024), (2048, 1024, 1024), (64, 64, 8192)


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path}/r.sqlite"
    fill(url, [
        Row("tf32x3", SQUARE, 30_000.0), Row("blocktile2d", SQUARE, 12_000.0), Row("naive", SQUARE, 900.0, OLD),
        Row("blocktile2d", OTHER, 11_000.0), Row("naive", FAR, 5_000.0, OLD), Row("smem", FAR, 100.0),
    ], baselines={SQUARE: 20_000.0})
    return url


def test_configs_are_accepted():
    for name, config in CONFIGS.items():
        assert kernels.FAMILIES[name].reject_reasons(config) == [], name


def test_families_and_source_hashes_filter_best_and_nearest(url):
    ffma = [n for n, f in kernels.FAMILIES.items() if f.precision == "ffma"]
    with db.open_database(url) as d:
        assert d.best(H100, *SQUARE).family == "tf32x3"
        b = d.best(H100, *SQUARE, families=ffma)
        assert (b.family, b.match, b.gflops, b.baseline_gflops) == ("blocktile2d", "exact", 12_000.0, 20_000.0)
        # Nearest is searched among the allowed families only: 64x64x8192 has only naive (old) and
        # smem; without the old version only smem remains.
        assert d.best(H100, 60, 60, 8000, families=ffma).family == "naive"
        current = {f.source_hash for f in kernels.FAMILIES.values()}
        b = d.best(H100, 60, 60, 8000, families=ffma, source_hashes=current)
        assert (b.family, b.match, b.problem.k) == ("smem", "nearest", 8192)
        # An empty set allows nothing; a bare string is refused, not read as a set of letters.
        assert d.best(H100, *SQUARE, families=[]) is None
        with pytest.raises(db.InvalidInputError, match="families"):
            d.best(H100, *SQUARE, families="naive")
        assert [p.problem.k for p in d.nearest_problems(H100, 60, 60, 8000, families=["tf32x3"])] == [1024]
        assert [r.family for r in d.top_k(H100, *SQUARE, families=ffma)] == ["blocktile2d", "naive"]


def test_overview_per_precision(url):
    with db.open_database(url) as d:
        cells = {(c.problem.m, c.problem.k): c.family for c in d.overview()}
        assert cells[(1024, 1024)] == "tf32x3"
        cells = {(c.problem.m, c.problem.k): c.family for c in d.overview(families=["naive", "blocktile2d", "smem"])}
        assert cells == {(1024, 1024): "blocktile2d", (2048, 1024): "blocktile2d", (64, 8192): "naive"}


def test_best_table_holds_every_version_best_and_the_marker_moves(url):
    with db.open_database(url) as d:
        table = d.best_table()
        assert len(table) == 6 and all(r.match == "exact" for r in table)
        by = {(r.family, r.problem.m): r for r in table}
        assert by[("tf32x3", 1024)].fraction_of_cublas == pytest.approx(1.5)
        assert by[("blocktile2d", 2048)].baseline_gflops is None
        assert all(r.gflops < 10 * 30_000 for r in table)  # the planted faster failures never count
        before = d.change_marker()
        assert d.change_marker() == before
    fill(url, [Row("smem", OTHER, 50.0)])
    with db.open_database(url) as d:
        assert d.change_marker() != before
        assert len(d.best_table()) == 7
