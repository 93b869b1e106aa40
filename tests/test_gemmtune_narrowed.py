"""A parameter space narrowed without a source change (wgmma's FLUSH = 2, dropped while wgmma.cu
stayed the same) leaves stored results that the installed family refuses. Every source that is
told the device's architecture answers with the fastest config the family still accepts, rather
than the refused faster one that dispatch would then leave to the library: the database, an
exported pack and the API (a real uvicorn server), on CPU against a real SQLite file."""

from __future__ import annotations

import httpx
import pytest
from results_support import CONFIGS, H100, Row, fill
from test_api_support import Server

import db
import kernels
from gemmtune.dispatch import Dispatcher
from gemmtune.pack import build_pack, write_pack
from gemmtune.precision import refusal, runnable_on

ARCH = "sm_90"
NARROW, ONLY_REFUSED = (3072, 3072, 1024), (2048, 512, 512)
KEPT = CONFIGS["wgmma"]  # FLUSH = 4
DROPPED = {**KEPT, "FLUSH": 2}  # stored when the space still held it, same source
ROWS = [
    Row("wgmma", NARROW, 90_000.0, config=tuple(DROPPED.items())),
    Row("wgmma", NARROW, 80_000.0, config=tuple(KEPT.items())),
    Row("tf32x3", NARROW, 60_000.0),
    Row("wgmma", ONLY_REFUSED, 50_000.0, config=tuple(DROPPED.items())),
]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('narrowed')}/results.sqlite"
    fill(url, ROWS)
    return url


@pytest.fixture(scope="module")
def pack_path(url, tmp_path_factory):
    with db.open_database(url) as d:
        return str(write_pack(build_pack(d), tmp_path_factory.mktemp("pack") / "pack.json"))


@pytest.fixture(scope="module")
def server(url):
    s = Server(url)
    yield s
    s.stop()


def choose(source, shape):
    return Dispatcher().choose(device=0, gpu=H100, arch=ARCH, m=shape[0], n=shape[1], k=shape[2], precision="fp32",
                               source=source)


def test_the_dropped_value_is_refused_with_its_reason():
    assert "FLUSH" in refusal("wgmma", DROPPED, ARCH) and refusal("wgmma", KEPT, ARCH) is None
    assert refusal("wgmma", KEPT, "sm_86") is not None  # a Hopper family on Ampere
    assert refusal("gone", KEPT, ARCH) == "family 'gone' is not installed"
    accept = runnable_on(ARCH)
    assert accept("wgmma", KEPT) and not accept("wgmma", DROPPED) and runnable_on(None) is None


def test_the_database_answers_the_fastest_accepted_config(url):
    with db.open_database(url) as d:
        assert d.best(H100, *NARROW).params == DROPPED  # without a filter: as stored
        found = d.best(H100, *NARROW, accept=runnable_on(ARCH))
        assert (found.match, found.params, found.gflops) == ("exact", KEPT, 80_000.0)
        # a problem whose every config is refused counts as not tuned: the nearest accepted answers
        near = d.best(H100, *ONLY_REFUSED, accept=runnable_on(ARCH))
        assert near.match == "nearest" and (near.problem.m, near.problem.n, near.problem.k) == NARROW
        assert d.best(H100, *ONLY_REFUSED, nearest=False, accept=runnable_on(ARCH)) is None


@pytest.mark.parametrize("kind", ["database", "pack", "api"])
def test_dispatch_runs_the_fastest_accepted_config_from_every_source(url, pack_path, server, kind):
    source = {"database": url, "pack": pack_path, "api": server.base}[kind]
    c = choose(source, NARROW)
    assert (c.kind, c.match, c.family, c.config, c.gflops) == ("kernel", "exact", "wgmma", KEPT, 80_000.0), str(c)
    c = choose(source, ONLY_REFUSED)
    assert (c.kind, c.match, c.config, c.tuned_shape) == ("kernel", "nearest", KEPT, NARROW), str(c)


def test_the_exported_pack_holds_no_refused_config(pack_path):
    import json

    entries = json.loads(open(pack_path).read())["entries"]
    assert all(refusal(e["family"], e["config"], ARCH) is None for e in entries)
    assert [(e["m"], e["n"], e["k"], e["config"]) for e in entries if e["family"] == "wgmma"] == [(*NARROW, KEPT)]


def test_the_api_filters_by_arch_only_when_asked_and_names_a_bad_one(server):
    def best(**params):
        return httpx.get(f"{server.base}/api/best", params={"gpu": H100, "m": NARROW[0], "n": NARROW[1],
                                                             "k": NARROW[2], **params}, timeout=10)

    for _ in range(2):  # the second from the snapshot's cached response where it may be
        assert best().json()["best"]["config"] == DROPPED
        assert best(arch=ARCH).json()["best"]["config"] == KEPT
    r = best(arch="hopper")
    assert r.status_code == 422 and "sm_" in r.text
    assert kernels.arch_of("9.0") == ARCH and kernels.arch_of("8.6") == "sm_86"
    with pytest.raises(ValueError, match="compute capability must look like '9.0'"):
        kernels.arch_of("nine")
