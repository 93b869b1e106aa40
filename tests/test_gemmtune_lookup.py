"""gemmtune's dispatch decision on CPU: lookup order, nearest, cuBLAS-beats-us fallback, precision
filter, packs (round trip, stale versions), unreachable sources — against real SQLite files
written through db's API, real pack files and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import warnings

import db
import kernels
import pytest
from results_support import H100, ROOT, Row, fill
from test_api_support import Server

import gemmtune
from gemmtune.dispatch import Dispatcher, decide
from gemmtune.pack import PackSource, build_pack, read_pack, write_pack
from gemmtune.sources import Answer, DatabaseSource, HttpSource, SourceUnavailable, open_source

OLD = hashlib.sha256(b"an older smem.cu").hexdigest()
SQUARE, TALL, FAR = (1024, 1024, 1024), (2048, 1024, 1024), (64, 64, 8192)
ROWS = [
    Row("tf32x3", SQUARE, 30_000.0),  # fastest overall on 1024³, but tensor-core emulation
    Row("blocktile2d", SQUARE, 12_000.0),  # best FFMA on 1024³: slower than cuBLAS (20 TFLOP/s)
    Row("blocktile2d", TALL, 11_000.0),  # no baseline measured: ours stands
    Row("smem", FAR, 5_000.0, OLD),  # an older smem.cu: must never run
    Row("naive", FAR, 100.0),
]
BASELINES = {SQUARE: 20_000.0}
ARCH = "sm_90"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('gemmtune')}/results.sqlite"
    fill(url, ROWS, BASELINES)
    return url


def choose(source, shape, precision="fp32", gpu=H100, dispatcher=None, strict=False):
    d = dispatcher or Dispatcher()
    return d.choose(device=0, gpu=gpu, arch=ARCH, m=shape[0], n=shape[1], k=shape[2], precision=precision,
                    source=source, strict=strict)


def summary(c):
    return (c.kind, c.match, c.family, c.tuned_shape)


# The expected choice per (shape, precision), the same for every kind of source.
EXPECTED = {
    (SQUARE, "fp32"): ("kernel", "exact", "tf32x3", SQUARE),
    (SQUARE, "ffma"): ("library", "exact", "blocktile2d", SQUARE),  # cuBLAS measured faster
    (TALL, "ffma"): ("kernel", "exact", "blocktile2d", TALL),
    ((2000, 1000, 1000), "ffma"): ("kernel", "nearest", "blocktile2d", TALL),
    ((1000, 1000, 1000), "fp32"): ("kernel", "nearest", "tf32x3", SQUARE),
    ((60, 60, 8000), "ffma"): ("kernel", "nearest", "naive", FAR),  # the old smem is skipped
}


@pytest.mark.parametrize(("shape", "precision"), list(EXPECTED))
def test_database_source(url, shape, precision):
    c = choose(url, shape, precision)
    assert summary(c) == EXPECTED[(shape, precision)]
    assert c.source == url and c.gpu == H100 and c.precision == precision


def test_choice_carries_provenance_and_reads_well(url):
    c = choose(url, SQUARE, "fp32")
    assert c.config == kernels.FAMILIES["tf32x3"].starting_points[0] | {"RASTER": 1} or c.config
    assert c.kernel_family is kernels.FAMILIES["tf32x3"] and c.gflops == 30_000.0 and c.cublas_gflops == 20_000.0
    with db.open_database(url) as d:
        assert c.trial_id == d.best(H100, *SQUARE).trial_id and c.run_id == d.best(H100, *SQUARE).run_id
    text = str(c)
    assert "tf32x3" in text and "exact match" in text and f"trial {c.trial_id}" in text and url in text
    lib = choose(url, SQUARE, "ffma")
    assert "cuBLAS measured 20000 GFLOP/s" in lib.reason and "library GEMM" in str(lib)


def test_unknown_gpu_and_missing_database_fall_back_without_creating_files(url, tmp_path):
    c = choose(url, SQUARE, gpu="NVIDIA A100-SXM4-80GB")
    assert c.kind == "library" and "never tuned" in c.reason
    missing = tmp_path / "nowhere" / "none.sqlite"
    c = choose(f"sqlite:///{missing}", SQUARE)
    assert c.kind == "library" and "does not exist" in c.reason
    assert not missing.parent.exists()  # a lookup never creates a database


def test_lookups_are_cached_per_key(url):
    class Counting(DatabaseSource):
        calls = 0

        def lookup(self, *args):
            Counting.calls += 1
            return super().lookup(*args)

    src, d = Counting(url), Dispatcher()
    first = choose(src, SQUARE, dispatcher=d)
    assert choose(src, SQUARE, dispatcher=d) is first and Counting.calls == 1
    choose(src, SQUARE, "ffma", dispatcher=d)
    choose(src, TALL, dispatcher=d)
    assert Counting.calls == 3


def test_concurrent_first_calls_look_up_once(url):
    from concurrent.futures import ThreadPoolExecutor

    class Counting(DatabaseSource):
        calls = 0

        def lookup(self, *args):
            Counting.calls += 1
            return super().lookup(*args)

    src, d = Counting(url), Dispatcher()
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda _: choose(src, TALL, dispatcher=d), range(32)))
    assert Counting.calls == 1 and all(c is found[0] for c in found)


def test_precision_filter_never_offers_tensor_core_families_to_ffma(url):
    for shape in (SQUARE, (1000, 1000, 1000), (4096, 4096, 4096)):
        c = choose(url, shape, "ffma")
        assert c.family is None or kernels.FAMILIES[c.family].precision == "ffma"
    with pytest.raises(ValueError, match="precision must be one of 'ffma', 'fp32'"):
        choose(url, SQUARE, "tf32")


def test_decide_refuses_configs_the_installed_family_rejects():
    from gemmtune.sources import Entry

    bad = dict(BM=256, BN=256, BK=32, WM=64, WN=64, KGROUP=4, STAGES=4, SPLITK=1, RASTER=1)  # too much smem
    e = Entry("exact", SQUARE, 0.0, H100, "tf32x3", kernels.FAMILIES["tf32x3"].source_hash, bad, 1e5, None)
    c = decide(Answer(e), gpu=H100, requested=SQUARE, precision="fp32", source="x", arch="sm_86")
    assert c.kind == "library" and "refuses the stored config on sm_86" in c.reason


# --- packs ------------------------------------------------------------------------------------------


def test_pack_round_trip_answers_like_the_database(url, tmp_path):
    with db.open_database(url) as d:
        pack = build_pack(d)
    path = write_pack(pack, tmp_path / "pack.json")
    loaded = read_pack(path)
    assert loaded == json.loads(path.read_text()) and loaded["format"] == "gemmtune-pack"
    # One entry per (GPU, shape, class); the old smem version is not exported.
    keys = [(e["gpu"], e["m"], e["n"], e["k"], e["precision"]) for e in loaded["entries"]]
    assert len(keys) == len(set(keys)) == 4 and all(e["family"] != "smem" for e in loaded["entries"])
    e = next(e for e in loaded["entries"] if e["family"] == "tf32x3")
    assert e["precision"] == "fp32-tc" and e["fraction_of_cublas"] == pytest.approx(1.5)
    assert e["source_hash"] == kernels.FAMILIES["tf32x3"].source_hash and e["run_id"] and e["trial_id"]
    for (shape, precision), expected in EXPECTED.items():
        assert summary(choose(str(path), shape, precision)) == expected, (shape, precision)
    assert build_pack(db.open_database(url), precision="ffma")["entries"] == [
        e for e in loaded["entries"] if e["precision"] == "ffma"]


def test_pack_entries_of_other_kernel_versions_are_skipped_with_one_warning(url, tmp_path):
    with db.open_database(url) as d:
        pack = build_pack(d)
    for e in pack["entries"]:
        if e["family"] == "tf32x3":
            e["source_hash"] = "0" * 64  # as if tf32x3.cu changed since the pack was made
    path = write_pack(pack, tmp_path / "stale.json")
    src = PackSource(path)
    with pytest.warns(RuntimeWarning, match=r"skipped 1 entries .* tf32x3 \(1\).* never run"):
        c = choose(src, SQUARE, "fp32")
    assert c.family != "tf32x3" and c.kind == "library"  # blocktile2d left, and cuBLAS beats it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choose(src, TALL, "fp32")  # the pack is read once: no second warning


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"), ('{"format": "other"}', "is not a gemmtune pack"),
    ('{"format": "gemmtune-pack", "version": 99, "entries": []}', "version 99"),
    ('{"format": "gemmtune-pack", "version": 1, "entries": [{"gpu": "x"}]}', "entry 0 lacks m, n, k"),
])
def test_bad_pack_is_unavailable_not_a_crash(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match=message):
        c = choose(str(path), SQUARE)
    assert c.kind == "library" and c.unavailable and message.split()[0] in c.reason
    with pytest.raises(SourceUnavailable, match=message):
        choose(str(path), SQUARE, strict=True)


def test_export_pack_command(url, tmp_path):
    out = tmp_path / "cli.json"
    done = subprocess.run([sys.executable, "-m", "gemmtune", "export-pack", "--db", url, "-o", str(out),
                           "--precision", "ffma"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 3 entries for 1 GPU model(s) {H100}" in done.stdout
    assert {e["precision"] for e in read_pack(out)["entries"]} == {"ffma"}
    shown = subprocess.run([sys.executable, "-m", "gemmtune", "show-pack", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.count(" ok") == 3
    missing = subprocess.run([sys.executable, "-m", "gemmtune", "export-pack", "--db", str(tmp_path / "no.sqlite")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


# --- sources that cannot be read ---------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connections are refused


def test_unreachable_api_warns_once_and_falls_back(recwarn):
    d = Dispatcher()
    src = f"http://127.0.0.1:{closed_port()}"
    first = choose(src, SQUARE, dispatcher=d)
    second = choose(src, TALL, dispatcher=d)
    assert first.kind == second.kind == "library" and "cannot reach the gemmtune API" in first.reason
    assert len([w for w in recwarn if "cannot reach" in str(w.message)]) == 1
    with pytest.raises(SourceUnavailable, match="cannot reach"):
        choose(src, SQUARE, dispatcher=d, strict=True)


def test_a_file_that_is_not_a_database_is_unavailable(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.warns(RuntimeWarning, match="cannot open the results database"):
        assert choose(str(junk), SQUARE).kind == "library"


def test_source_spellings():
    assert isinstance(open_source("http://127.0.0.1:1"), HttpSource)
    assert isinstance(open_source("pack.json"), PackSource)
    assert isinstance(open_source("sqlite:///x.sqlite"), DatabaseSource)
    assert isinstance(open_source("/tmp/results.sqlite"), DatabaseSource)
    with pytest.raises(TypeError, match="source must be a non-empty string"):
        open_source("")
    assert "secret" not in HttpSource("http://user:secret@127.0.0.1:8000").label
    pg = DatabaseSource("postgresql://u:secret@db.example/gt")
    assert "secret" not in pg.label and "connect_timeout=4" in pg.url  # unreachable: seconds, not minutes


# --- the HTTP API as source ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(url):
    s = Server(url, env={"GEMMTUNE_API_TOKEN": "sesame"})
    yield s
    s.stop()


@pytest.mark.parametrize(("shape", "precision"), list(EXPECTED))
def test_api_source_answers_like_the_database(server, shape, precision):
    c = choose(server.base, shape, precision)
    assert summary(c) == EXPECTED[(shape, precision)]


def test_api_source_trial_id_matches_and_unknown_gpu(server, url):
    c = choose(server.base, SQUARE)
    with db.open_database(url) as d:
        assert c.trial_id == d.best(H100, *SQUARE).trial_id
    assert choose(server.base, SQUARE, gpu="Unknown GPU").kind == "library"


def test_tune_on_miss_queues_a_job_and_goes_on(server, url):
    src = HttpSource(server.base, token="sesame", tune_on_miss=True)
    c = choose(src, (3000, 1000, 1000), "ffma")
    assert c.kind == "kernel" and c.match == "nearest"
    assert any("tuning job" in n and "queued" in n for n in c.notes), c.notes
    assert "tuning job" in str(c)
    with db.open_database(url) as d:
        jobs = [j for j in d.list_jobs() if (j.m, j.n, j.k) == (3000, 1000, 1000)]
    assert len(jobs) == 1 and jobs[0].origin == "request" and "tf32x3" not in jobs[0].families
    assert set(jobs[0].families) == {n for n, f in kernels.FAMILIES.items() if f.precision == "ffma"}
    # An exact hit queues nothing; without a token nothing is queued and the note says why.
    assert choose(src, TALL).notes == ()
    no_token = choose(HttpSource(server.base, token="", tune_on_miss=True), (3001, 1000, 1000))
    assert any("no write token" in n for n in no_token.notes)


def test_public_names():
    assert callable(gemmtune.matmul) and callable(gemmtune.explain)
    assert gemmtune.PRECISION_NAMES == ("ffma", "fp32")
    gemmtune.clear_cache()


# --- layouts and batches ----------------------------------------------------------------------------

LINEAR, HEADS = (4096, 3072, 1024), (512, 512, 64)  # x @ W.T, and attention's scores per head
LAYOUT_ROWS = [
    Row("tf32x3", LINEAR, 40_000.0, layout="nt"),
    Row("blocktile2d", LINEAR, 9_000.0),  # the same shape in nn: another problem
    Row("tf32x3", HEADS, 20_000.0, layout="nt", batch=128),
]


@pytest.fixture(scope="module")
def layout_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('layouts')}/results.sqlite"
    fill(url, LAYOUT_ROWS)
    return url


def choose_problem(source, shape, layout="nn", batch=1, exact_only=False):
    return Dispatcher().choose(device=0, gpu=H100, arch=ARCH, m=shape[0], n=shape[1], k=shape[2], precision="fp32",
                               source=source, layout=layout, batch=batch, exact_only=exact_only)


@pytest.mark.parametrize("kind", ["database", "pack"])
def test_each_layout_and_batch_is_its_own_problem(layout_url, tmp_path, kind):
    source = layout_url
    if kind == "pack":
        with db.open_database(layout_url) as d:
            source = str(write_pack(build_pack(d), tmp_path / "pack.json"))
        entries = read_pack(source)["entries"]
        assert {(e["layout"], e["batch"]) for e in entries} == {("nt", 1), ("nn", 1), ("nt", 128)}
    nt = choose_problem(source, LINEAR, "nt")
    assert (nt.kind, nt.match, nt.family, nt.layout) == ("kernel", "exact", "tf32x3", "nt")
    nn = choose_problem(source, LINEAR, "nn")
    assert (nn.match, nn.family) == ("exact", "blocktile2d")
    # the nearest problem is one of the same layout, the batch counted as a fourth size
    near = choose_problem(source, HEADS, "nt", batch=96)
    assert (near.kind, near.match, near.family) == ("kernel", "nearest", "tf32x3")
    assert near.tuned_shape == HEADS and near.distance == pytest.approx(abs(__import__("math").log2(128 / 96)))
    assert choose_problem(source, HEADS, "tn", batch=128).kind == "library"  # no tn tuned at all
    # the switch runs only kernels tuned on the problem itself
    strict = choose_problem(source, HEADS, "nt", batch=96, exact_only=True)
    assert strict.kind == "library" and "tuned only on other shapes" in strict.reason
    assert "128x512x512x64:nt" in str(choose_problem(source, HEADS, "nt", batch=128))


def test_the_api_answers_per_layout_and_batch(layout_url):
    s = Server(layout_url)
    try:
        nt = choose_problem(s.base, LINEAR, "nt")
        assert (nt.match, nt.family) == ("exact", "tf32x3")
        batched = choose_problem(s.base, HEADS, "nt", batch=128)
        assert (batched.match, batched.family) == ("exact", "tf32x3")
        import urllib.request

        with urllib.request.urlopen(f"{s.base}/api/best?gpu={H100.replace(' ', '%20')}&m=512&n=512&k=64"
                                    "&layout=xx") as r:  # noqa: S310
            pytest.fail(f"layout=xx answered {r.status}")
    except urllib.error.HTTPError as err:
        assert err.code == 422 and b"nn" in err.read()
    finally:
        s.stop()
