"""The cost model's unit rows kept on disk (tuner.search.rowcache): read back bit for bit, never
stale, recomputed where damaged, one file per unit; and through costmodel._unit_rows."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tuner.measure.recording import BUNDLED_RECORDINGS, load
from tuner.search import costmodel, rowcache
from tuner.search.learned import examples_from_recordings


@pytest.fixture(scope="module")
def unit_examples():
    recording = load(BUNDLED_RECORDINGS / "h100-pipelined-1023x1025x999.json.gz")
    units = costmodel.by_unit(examples_from_recordings([recording]))
    unit, examples = next(iter(units.items()))
    return unit, examples


def _direct(unit, examples):
    family = costmodel.kernels.get_family(examples[0].family)
    laid_out = [(e, g) for e in examples if (g := costmodel._geometry_of(family, e)) is not None]
    x = costmodel.matrix(family, [e.config for e, _ in laid_out], examples[0].problem, examples[0].target,
                         [g for _, g in laid_out])
    return ({costmodel._config_key(e.config): row for (e, _), row in zip(laid_out, x)},
            max(e.gflops for e, _ in laid_out))


def _same(a, b) -> bool:
    return (a[1] == b[1] and list(a[0]) == list(b[0])
            and all(np.array_equal(a[0][k], b[0][k], equal_nan=True) for k in a[0]))


def test_rows_written_once_are_read_back_bit_for_bit(tmp_path, unit_examples):
    unit, examples = unit_examples
    calls: list[int] = []
    first = rowcache.unit_rows(unit, examples, lambda: (calls.append(1), _direct(unit, examples))[1], tmp_path)
    again = rowcache.unit_rows(unit, examples, lambda: (calls.append(1), _direct(unit, examples))[1], tmp_path)
    assert calls == [1] and _same(first, again) and len(first[0]) > 100
    assert len(list((tmp_path / rowcache.FOLDER).glob("*.npz"))) == 1


def test_other_examples_or_other_code_are_not_read_from_the_file(tmp_path, unit_examples, monkeypatch):
    unit, examples = unit_examples
    calls: list[int] = []
    compute = lambda: (calls.append(1), _direct(unit, examples))[1]  # noqa: E731
    rowcache.unit_rows(unit, examples, compute, tmp_path)
    fewer = examples[:-1]  # a unit's measurements only grow: another state, another file
    rowcache.unit_rows(unit, fewer, lambda: (calls.append(1), _direct(unit, fewer))[1], tmp_path)
    assert calls == [1, 1]
    monkeypatch.setattr(rowcache, "code_digest", lambda: "another-version")
    rowcache.unit_rows(unit, examples, compute, tmp_path)
    assert calls == [1, 1, 1]
    # the unit's file of the older code is gone: one file per unit state
    names = sorted(p.name for p in (tmp_path / rowcache.FOLDER).glob("*.npz"))
    assert len(names) == 2 and sum(n.endswith("another-version.npz") for n in names) == 1


def test_a_damaged_file_is_recomputed_and_rewritten(tmp_path, unit_examples):
    unit, examples = unit_examples
    calls: list[int] = []
    compute = lambda: (calls.append(1), _direct(unit, examples))[1]  # noqa: E731
    rowcache.unit_rows(unit, examples, compute, tmp_path)
    (path,) = (tmp_path / rowcache.FOLDER).glob("*.npz")
    path.write_bytes(path.read_bytes()[:100])
    rows = rowcache.unit_rows(unit, examples, compute, tmp_path)
    assert calls == [1, 1] and _same(rows, _direct(unit, examples))
    assert _same(rowcache.unit_rows(unit, examples, compute, tmp_path), rows) and calls == [1, 1]


def test_examples_naming_different_parameters_are_not_cached(tmp_path, unit_examples):
    unit, examples = unit_examples
    odd = list(examples[:3]) + [dataclasses.replace(examples[3],
                                                    config={**examples[3].config, "EXTRA": 1})]
    calls: list[int] = []
    rowcache.unit_rows(unit, odd, lambda: (calls.append(1), ({}, 0.0))[1], tmp_path)
    assert calls == [1] and not (tmp_path / rowcache.FOLDER).exists()


def test_the_cost_models_unit_rows_come_from_the_file_in_a_fresh_process(tmp_path, unit_examples, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE", str(tmp_path))
    unit, examples = unit_examples
    expected = _direct(unit, examples)
    costmodel._unit_rows_kept.pop(unit, None)
    assert _same(costmodel._unit_rows(unit, examples), expected)
    costmodel._unit_rows_kept.pop(unit, None)  # as a new process starts
    monkeypatch.setattr(costmodel, "matrix", lambda *a, **k: pytest.fail("laid out again"))
    assert _same(costmodel._unit_rows(unit, examples), expected)


def test_a_recording_laid_out_in_another_process_is_read_by_a_studys_fit(tmp_path, monkeypatch):
    """``learned.lay_out_bundled`` (the command's start runs it on idle compile workers): the
    rows of a bundled recording's units, as the first study's fit asks for them with the
    examples it reads (``examples_for_study``), come from the file, not laid out again."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    import db
    from tuner.measure.recording import bundled_file
    from tuner.problem import Problem
    from tuner.search.learned import examples_for_study, lay_out_bundled

    monkeypatch.setenv("GEMMTUNE_CACHE", str(tmp_path))
    name = "h100-pipelined-1023x1025x999.json.gz"
    gpu = bundled_file(name).gpu["name"]
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as other:
        assert other.submit(lay_out_bundled, gpu, name).result() >= 1
        assert other.submit(lay_out_bundled, "another GPU", name).result() == 0
    database = db.open_database(f"sqlite:///{tmp_path / 'r.sqlite'}")
    try:
        examples = examples_for_study(database, gpu, Problem(4096, 4096, 4096), True)
    finally:
        database.close()
    units = costmodel.by_unit(examples)
    laid_out = [unit for unit in units if unit[1:] == ("pipelined", "1023x1025x999")]
    assert laid_out
    monkeypatch.setattr(costmodel, "matrix", lambda *a, **k: pytest.fail("laid out again"))
    for unit in laid_out:
        costmodel._unit_rows_kept.pop(unit, None)
        rows, best = costmodel._unit_rows(unit, units[unit])
        assert len(rows) > 100 and best > 0
