"""Issue 19: a family's accepted configs enumerated once per architecture and read back from
the file beside the CUBIN cache: the same configs, never from a stale or damaged file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kernels
import numpy as np

from tuner.search import enumcache
from tuner.search.study import _accepted_configs
from tuner.measure.recording import BUNDLED_RECORDINGS

VECTORIZED = kernels.get_family("vectorized")


def _counted(family: Any, arch: str, calls: list[int]) -> Any:
    def enumerate_() -> list[dict[str, int]] | None:
        calls.append(1)
        return _accepted_configs(family, arch)
    return enumerate_


def test_the_file_gives_the_configs_a_fresh_enumeration_gives(tmp_path: Path) -> None:
    calls: list[int] = []
    fresh = _accepted_configs(VECTORIZED, "sm_90")
    assert fresh
    cold = enumcache.accepted(VECTORIZED, "sm_90", tmp_path, _counted(VECTORIZED, "sm_90", calls))
    warm = enumcache.accepted(VECTORIZED, "sm_90", tmp_path, _counted(VECTORIZED, "sm_90", calls))
    assert calls == [1] and cold == warm == fresh
    assert all(type(v) is int for v in warm[0].values())
    # another architecture is another file
    enumcache.accepted(VECTORIZED, "sm_80", tmp_path, _counted(VECTORIZED, "sm_80", calls))
    assert calls == [1, 1] and len(list((tmp_path / enumcache.FOLDER).glob("*.npy"))) == 2


def test_a_stale_key_is_not_used(tmp_path: Path, monkeypatch: Any) -> None:
    calls: list[int] = []
    enumcache.accepted(VECTORIZED, "sm_90", tmp_path, _counted(VECTORIZED, "sm_90", calls))
    old = enumcache.path_for(VECTORIZED, "sm_90", tmp_path)
    np.save(old, np.zeros((1, len(VECTORIZED.params)), dtype=np.int64))  # would be wrong
    monkeypatch.setattr(type(VECTORIZED), "source_hash", property(lambda self: "changed"))
    assert enumcache.path_for(VECTORIZED, "sm_90", tmp_path) != old
    again = enumcache.accepted(VECTORIZED, "sm_90", tmp_path,
                               _counted(VECTORIZED, "sm_90", calls))
    assert calls == [1, 1] and again == _accepted_configs(VECTORIZED, "sm_90")


def test_a_damaged_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    path = enumcache.path_for(VECTORIZED, "sm_90", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a numpy file")
    calls: list[int] = []
    configs = enumcache.accepted(VECTORIZED, "sm_90", tmp_path,
                                 _counted(VECTORIZED, "sm_90", calls))
    assert calls == [1] and configs == _accepted_configs(VECTORIZED, "sm_90")
    assert np.load(path).shape == (len(configs), len(VECTORIZED.params))


def test_a_space_too_large_to_enumerate_and_a_fake_family_are_not_cached(tmp_path: Path) -> None:
    assert enumcache.accepted(VECTORIZED, "sm_90", tmp_path, lambda: None) is None

    class Fake:
        name = "vectorized"  # a registered name, not the registered family
        params = VECTORIZED.params

    assert enumcache.accepted(Fake(), "sm_90", tmp_path, lambda: [{"x": 1}]) == [{"x": 1}]
    assert not (tmp_path / enumcache.FOLDER).exists()


def test_a_recorded_grid_enumerates_to_the_filtered_product_of_its_narrowed_values() -> None:
    """The pruned walk (kernels.space.enumerate_accepted) on a family narrowed to a recording's
    grid: exactly the configs, in the order, that filtering the narrowed product gives."""
    import itertools

    from tuner.measure.replay import ReplayEvaluator

    recording = BUNDLED_RECORDINGS / "h100-tf32x3-3000x3000x3000.json.gz"
    family = ReplayEvaluator.open(recording).family(kernels.get_family("tf32x3"))
    names = [p.name for p in family.params]
    product = [dict(zip(names, values))
               for values in itertools.product(*(p.values for p in family.params))]
    expected = [c for c in product if not family.reject_reasons(c, "sm_90")]
    assert expected and len(expected) < len(product)  # the grid's and the rules' rejections
    assert _accepted_configs(family, "sm_90") == expected
