"""bench/accumulation_model.py: the pieces of the model against hand-worked cases, and what
its fitted constant must reproduce (the measured errors it was fitted on are in the docs)."""

from __future__ import annotations

import numpy as np
import pytest

from bench_support import bench_module


@pytest.fixture(scope="module")
def model():
    return bench_module("accumulation_model")


def test_the_split_rounds_to_nearest_tf32_and_keeps_the_rest(model):
    x = np.array([1 + 2**-11, 1 + 2**-10 + 2**-12, -(1 + 3 * 2**-12), 3.0], np.float32)
    big, small = model.split(x)
    # TF32 keeps 10 stored bits: 1 + 2^-11 is a tie (rounds away), 1 + 2^-10 + 2^-12 rounds
    # down, 1 + 3·2^-12 up (in magnitude), and small takes either sign
    assert big.tolist() == [1 + 2**-10, 1 + 2**-10, -(1 + 2**-10), 3.0]
    assert small.tolist() == [-(2**-11), 2**-12, 2**-12, 0.0]
    assert np.array_equal(big.astype(np.float64) + small, x.astype(np.float64))


def test_an_mma_cuts_toward_zero_below_the_largest_terms_bits(model):
    acc = np.array([1.0, 1.0], np.float32)
    tiny = 2.0**-30  # below 26 bits under the accumulator's leading bit: cut off
    products = np.array([[tiny] * 8, [2.0**-20] * 8])
    out = model.mma(acc, products, 26)
    assert out[0] == 1.0, "terms under the alignment grid are dropped, toward zero"
    assert out[1] == np.float32(1 + 8 * 2.0**-20)
    # the sum itself is cut toward zero to FP32, also for negative sums
    assert model.toward_zero_fp32(np.array([1 + 2**-24 + 2**-30, -(1 + 2**-24 + 2**-30)])
                                  ).tolist() == [1.0, -1.0]


def test_the_fitted_constant_reproduces_the_measured_errors_it_was_fitted_on(model):
    """In-sample by construction (--align-bits 26 was chosen on these rows): the model's error
    for the interleaved order on bench/accuracy.py's inputs within 12 % of wgmma's measured one
    when it summed in that order (H200, FLUSH = 4), where 24 bits, the tensor core's FP32 width,
    would be 33 % over."""
    rows = model.measured_rows(model.REPO / "bench" / "data" / "accuracy-h200-interleaved.json")
    accuracy = model.accuracy_bench()
    for kind, k in (("uniform", 1000), ("uniform", 4096)):
        seen = rows[(kind, k)]
        assert seen["wgmma"]["config"]["FLUSH"] == 4
        a, b = accuracy.make_inputs(kind, 1024, 1024, k, 0)
        a, b = a[:32], b[:, :32]
        ref = a.astype(np.float64) @ b.astype(np.float64)
        fitted = model.relative_error(model.emulate(a, b, 4, "interleaved", 26), ref)
        assert fitted == pytest.approx(seen["wgmma"]["relative"], rel=0.12), (kind, k)
    narrow = model.relative_error(model.emulate(a, b, 4, "interleaved", 24), ref)
    assert narrow > 1.25 * seen["wgmma"]["relative"]


def test_the_model_predicted_the_reordered_kernel_it_was_not_fitted_on(model):
    """Out of sample: wgmma summing small-first (bench/results/accuracy-h200.json, measured
    after the model's prediction was written) against the model with the same constant."""
    rows = model.measured_rows(model.REPO / "bench" / "results" / "accuracy-h200.json")
    accuracy = model.accuracy_bench()
    for kind in ("uniform", "wide-elements"):
        a, b = accuracy.make_inputs(kind, 1024, 1024, 4096, 0)
        a, b = a[:32], b[:, :32]
        ref = a.astype(np.float64) @ b.astype(np.float64)
        predicted = model.relative_error(model.emulate(a, b, 4, "small-first", 26), ref)
        assert predicted == pytest.approx(rows[(kind, 4096)]["wgmma"]["relative"], rel=0.15), kind


def test_cross_terms_first_cuts_the_big_sum_fewer_times(model):
    """On positive inputs every cut errs the same way: summing the cross terms first leaves
    FLUSH cuts at the big sum's scale instead of about 3·FLUSH, so the error falls (the
    prediction in docs/kernels.md rests on this)."""
    rng = np.random.default_rng(0)
    a, b = rng.random((24, 1024), np.float32), rng.random((1024, 24), np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    interleaved, first, pairs, apart = (
        model.relative_error(model.emulate(a, b, 4, order, 26), ref)
        for order in ("interleaved", "small-first", "small-first-pairs", "cross-apart"))
    assert first < 0.85 * interleaved
    assert first < pairs < interleaved  # half the cut-free cross terms: in between
    # cross terms in a fragment of their own, joined by round-to-nearest adds: as few cuts at
    # the big sum's scale as small-first
    assert apart < 0.85 * interleaved and apart == pytest.approx(first, rel=0.1)


@pytest.mark.parametrize("args, named", [(["--k", "1001"], "--k"), (["--flush", "3"], "--flush"),
                                         (["--kind", "sideways"], "--kind"),
                                         (["--block", "0"], "--block")])
def test_bad_arguments_are_refused_naming_what_was_wrong(model, args, named, capsys):
    with pytest.raises(SystemExit) as raised:
        model.main(args)
    assert raised.value.code == 2 and named in capsys.readouterr().err
