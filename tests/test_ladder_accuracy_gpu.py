"""The FFMA ladder's blocked sums over K on a real GPU: at K = 4096 with M = N = 1024, where
cuBLAS FP32 splits K and a single running sum per output had 1.3-3.9x its error, every rung
(naive ... splitk, each with its first config as bench/accuracy.py picks it) is at or below
cuBLAS FP32's error on every input kind of bench/accuracy.py, relative and component-wise; so is
skinny, which sums the same way, at its shortest splits of K.
Run on the GPU host: python -m pytest -m gpu tests/test_ladder_accuracy_gpu.py
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from bench_support import bench_module

import kernels

pytestmark = pytest.mark.gpu
LADDER = ("naive", "smem", "blocktile1d", "blocktile2d", "vectorized", "warptile", "pipelined", "splitk")


@pytest.fixture(scope="module")
def arch() -> str:
    cupy = pytest.importorskip("cupy")
    return f"sm_{cupy.cuda.Device(0).compute_capability}"


def over_target(accuracy: Any, row: dict[str, Any], labels: Iterable[str]) -> dict[str, dict[str, float]]:
    """The labels whose error (relative or component-wise) is over cuBLAS FP32's, with both ratios."""
    return {label: ratios for label in labels
            if max((ratios := accuracy.ratios(row, label)).values()) > accuracy.TARGET_RATIO}


@pytest.mark.parametrize("kind", ["uniform", "normal", "wide", "wide-elements", "cancellation", "tiny", "huge"])
def test_every_rung_at_most_cublas_fp32s_error_at_long_k(arch, kind):
    accuracy = bench_module("accuracy")
    configs = {name: kernels.get_family(name).first_config(arch, 0) for name in LADDER}
    row = accuracy.measure(kind, 1024, 1024, 4096, configs, seed=3)
    assert not (over := over_target(accuracy, row, LADDER)), (kind, over, row)


# skinny's shortest splits of K, where its single running sum per output missed cuBLAS FP32's
# error on 14 rows (docs/kernels.md, "skinny's blocked sums"): one warp per block and one slice
# of K, and the two next to it, against each input kind at K = 16384, where runs are longest.
SKINNY_SPLITS = ({"WK": 1, "SPLITK": 1}, {"WK": 2, "SPLITK": 1}, {"WK": 1, "SPLITK": 2})


@pytest.mark.parametrize("kind", ["uniform", "normal", "wide", "wide-elements", "cancellation", "tiny", "huge"])
def test_skinny_at_most_cublas_fp32s_error_at_its_shortest_splits_of_k(arch, kind):
    accuracy = bench_module("accuracy")
    skinny = kernels.get_family("skinny")
    base = skinny.first_config(arch, 0)
    configs = {f"skinny WK={s['WK']} SPLITK={s['SPLITK']}": {**base, **s} for s in SKINNY_SPLITS}
    assert all(not skinny.reject_reasons(c, arch) for c in configs.values()), configs
    row = accuracy.measure(kind, 1024, 1024, 16384, configs, seed=3)
    assert not (over := over_target(accuracy, row, configs)), (kind, over, row)
