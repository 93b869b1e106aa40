"""Shared test set-up: `gpu`-marked tests skip cleanly where no CUDA driver or GPU is usable."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def _no_gpu_reason() -> str | None:
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"no usable CUDA driver or GPU (cuInit: {getattr(err, 'name', err)})"
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count == 0:
            return "the CUDA driver reports no GPU"
    except Exception as error:  # bindings missing, or libcuda.so cannot be loaded
        return f"no CUDA driver: {error}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _no_gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def hopper_cupy():
    """CuPy on a Hopper GPU (sm_90), which the wgmma families need; skipped elsewhere."""
    cupy = pytest.importorskip("cupy")
    try:
        major = cupy.cuda.Device(0).compute_capability
    except Exception as e:  # no driver or device
        pytest.skip(f"no usable GPU: {e}")
    if major != "90":
        pytest.skip(f"the Hopper families need sm_90, this GPU is sm_{major}")
    return cupy
