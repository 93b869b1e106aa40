"""bench/accuracy.py's input kinds and family choice (CPU; the bench itself runs on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from bench_support import bench_module

FP32_MAX = float(np.finfo(np.float32).max)
FP32_MIN_NORMAL = float(np.finfo(np.float32).tiny)


@pytest.fixture(scope="module")
def accuracy():
    return bench_module("accuracy")


@pytest.mark.parametrize("kind", ["uniform", "normal", "wide", "wide-elements", "cancellation", "tiny", "huge"])
def test_every_kind_is_float32_finite_and_reproducible_from_its_seed(accuracy, kind):
    a, b = accuracy.make_inputs(kind, 5, 7, 33, seed=3)
    assert a.shape == (5, 33) and b.shape == (33, 7) and a.dtype == b.dtype == np.float32
    assert np.isfinite(a).all() and np.isfinite(b).all() and np.count_nonzero(a) == a.size
    again = accuracy.make_inputs(kind, 5, 7, 33, seed=3)
    other = accuracy.make_inputs(kind, 5, 7, 33, seed=4)
    assert np.array_equal(a, again[0]) and np.array_equal(b, again[1]) and not np.array_equal(a, other[0])
    assert set(accuracy.KINDS) == {"uniform", "normal", "wide", "wide-elements", "cancellation", "tiny", "huge"}


def test_the_wide_kinds_spread_rows_or_elements_over_many_binades(accuracy):
    a, b = accuracy.make_inputs("wide", 64, 64, 64, seed=0)
    rows = np.abs(a).max(axis=1)
    assert rows.max() / rows.min() > 2.0 ** 30  # whole rows carry their own scale
    assert np.ptp(np.log2(np.abs(a[0]))) < 12  # ... and within a row, a normal's spread
    e, _ = accuracy.make_inputs("wide-elements", 64, 64, 64, seed=0)
    assert all(np.ptp(np.log2(np.abs(row))) > 30 for row in e)  # each element its own scale


@pytest.mark.parametrize("k", [1000, 1001])
def test_cancellation_leaves_a_result_far_below_its_terms(accuracy, k):
    def left(kind: str) -> float:
        """How much of the terms' magnitude the result keeps (median over C)."""
        a, b = (x.astype(np.float64) for x in accuracy.make_inputs(kind, 16, 16, k, seed=1))
        return float(np.median(np.abs(a @ b) / (np.abs(a) @ np.abs(b))))

    # normal inputs keep ~3 % (a random walk); paired terms leave the small signal and, for an
    # odd K, one unpaired product: a hundred times less
    assert left("cancellation") < left("normal") / 100


def test_tiny_and_huge_sums_stay_within_fp32_normal_range(accuracy):
    k = 16384
    for kind in ("tiny", "huge"):
        a, b = (x.astype(np.float64) for x in accuracy.make_inputs(kind, 4, 4, k, seed=2))
        terms = np.abs(a) @ np.abs(b)
        assert terms.max() < FP32_MAX / 2 and np.abs(a @ b).max() > FP32_MIN_NORMAL * 1e3, kind
    a, _ = accuracy.make_inputs("tiny", 4, 4, 64, seed=2)
    assert 1e-20 < np.median(np.abs(a)) < 1e-17
    a, _ = accuracy.make_inputs("huge", 4, 4, 64, seed=2)
    assert 1e16 < np.median(np.abs(a)) < 1e18


def test_an_unknown_kind_names_the_known_ones(accuracy):
    with pytest.raises(ValueError, match="'float'.*uniform.*huge"):
        accuracy.make_inputs("float", 2, 2, 2, seed=0)


def test_every_fp32_class_family_offered_is_measured_with_an_accepted_config(accuracy):
    import kernels
    from gemmtune.precision import allowed_families

    on_hopper = accuracy.fp32_families("sm_90")
    assert set(on_hopper) == set(allowed_families("fp32")) and "wgmma" in on_hopper and "naive" in on_hopper
    assert "wgmma" not in accuracy.fp32_families("sm_80")
    for name, family in on_hopper.items():
        config = family.first_config("sm_90")
        assert family.accepts(config, "sm_90"), name
        if family.starting_points:
            assert config == dict(family.starting_points[0])
    assert list(accuracy.fp32_families("sm_90", ["wgmma", "naive"])) == [n for n in kernels.FAMILIES if n in ("wgmma", "naive")]
    with pytest.raises(ValueError, match="'?fp16x3'?.*allowed: naive"):
        accuracy.fp32_families("sm_90", ["fp16x3"])


def test_the_table_gives_each_family_as_a_multiple_of_cublas_and_names_what_misses(accuracy):
    def errors(rel: float, comp: float) -> dict[str, float]:
        return {"relative": rel, "componentwise": comp}

    rows = [{"kind": "uniform", "k": 4096, "cublas_fp32": errors(2e-7, 1e-6),
             "wgmma": errors(2.4e-7, 8e-7), "naive": errors(2e-7, 1e-6)},
            {"kind": "tiny", "k": 1000, "cublas_fp32": errors(4e-7, 2e-6),
             "wgmma": errors(2e-7, 1e-6), "naive": errors(0.0, 0.0)}]
    lines, missed = accuracy.table(rows, ["wgmma", "naive"])
    assert missed == ["wgmma uniform K=4096"]  # 1.2x on the relative error; 1.0x is allowed
    assert "1.20/0.80" in lines[1] and "1.00/1.00" in lines[1] and "0.50/0.50" in lines[2]
    assert lines[-1].endswith("NOT met (1: wgmma uniform K=4096)")
    assert accuracy.table(rows[1:], ["wgmma", "naive"])[1] == []


def test_variants_vary_each_summation_parameter_alone_where_the_family_accepts_it(accuracy):
    import kernels

    tf32x3 = kernels.get_family("tf32x3")
    base = dict(tf32x3.starting_points[-1])  # BK = 16, KGROUP = 2, SPLITK = 16
    assert (base["BK"], base["KGROUP"], base["SPLITK"]) == (16, 2, 16)
    found = accuracy.variants(tf32x3, base, "sm_90")
    assert list(found) == ["tf32x3 KGROUP=1", "tf32x3 SPLITK=1", "tf32x3 SPLITK=2",
                           "tf32x3 SPLITK=4", "tf32x3 SPLITK=8"]  # KGROUP=4 needs BK = 32
    assert found["tf32x3 KGROUP=1"] == {**base, "KGROUP": 1}
    assert all(accuracy.family_of(label) == "tf32x3" for label in found)
    # a family whose every config sums in one order has none
    assert accuracy.variants(kernels.get_family("pipelined"),
                             dict(kernels.get_family("pipelined").first_config("sm_90", 0)),
                             "sm_90") == {}


def test_summation_parameters_are_parameters_and_every_split_k_is_one():
    import kernels

    for family in kernels.FAMILIES.values():
        names = {p.name for p in family.params}
        assert set(family.summation_params) <= names, family.name
        if "SPLITK" in names:  # slices of K summed apart: always a change of order
            assert "SPLITK" in family.summation_params, family.name


def test_the_json_names_each_measured_configs_source_version(accuracy):
    families = accuracy.fp32_families("sm_90", ["wgmma", "f16x3"])
    configs = {name: f.first_config("sm_90") for name, f in families.items()}
    configs.update(accuracy.variants(families["f16x3"], configs["f16x3"], "sm_90"))
    hashes = accuracy.source_hashes(configs, families)
    assert set(hashes) == set(configs) and "f16x3 FLUSH=2" in hashes
    assert hashes["f16x3 FLUSH=2"] == hashes["f16x3"] == families["f16x3"].source_hash
    assert hashes["wgmma"] == families["wgmma"].source_hash != hashes["f16x3"]
