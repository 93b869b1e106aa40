"""bench/kt_first_generation.py: the shuffle it puts in Kernel Tuner's first generation."""

from __future__ import annotations

import pytest

from bench_support import bench_module

pytest.importorskip("kernel_tuner")


def test_the_first_generation_is_the_same_configs_in_another_order_each_time_the_same(monkeypatch):
    module = bench_module("kt_first_generation")
    sample = list(range(200, 264))  # as a set's order would hand them back: ascending
    monkeypatch.setattr(module, "_as_shipped", lambda self, n: list(sample))
    first = module._shuffled(None, len(sample))
    assert sorted(first) == sample  # the same configs, none lost or added
    assert first != sample  # in another order
    assert module._shuffled(None, len(sample)) == first  # seeded: a replay gives the same order


def test_it_replaces_the_method_kernel_tuner_calls():
    import kernel_tuner.searchspace as searchspace

    module = bench_module("kt_first_generation")
    # the function it wraps is Kernel Tuner's own, unchanged on import (only `shuffled` swaps it)
    assert module._as_shipped is searchspace.Searchspace.get_LHS_sample_indices
