"""Recording files: save/load round trip, what the header says, and clear errors for bad files.

The recordings made here are TEST FIXTURES from the analytic stand-in evaluator (no GPU); real
ones live in tuner/recordings/ and are checked at the end when there are any."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import kernels
import pytest

from tuner.measure.record import choose_configs, parse_grid, record_with_evaluator
from tuner.measure.recording import BUNDLED_RECORDINGS, RESULT_FIELDS, RecordingError, from_json, load
from tuner.measure.testing import StandInEvaluator, model_gflops
from tuner.problem import Problem

NAIVE = kernels.FAMILIES["naive"]
BLOCKTILE1D = kernels.FAMILIES["blocktile1d"]
P1, P2 = Problem(256, 256, 256), Problem(512, 128, 1024)
RECORDINGS = BUNDLED_RECORDINGS


def _fault(config: dict[str, int]) -> str | None:
    return "wrong_result" if config.get("BX") == 8 and config.get("BY") == 1 else None


@pytest.fixture(scope="module")
def fixture_recording():
    return record_with_evaluator(StandInEvaluator(fault=_fault), [NAIVE, BLOCKTILE1D], [P1, P2],
                                 max_configs=100, seed=7, note="test fixture (stand-in model)")


def test_round_trip_keeps_every_result_and_header(tmp_path, fixture_recording):
    path = fixture_recording.save(tmp_path / "r.json.gz")
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    loaded = load(path)
    assert loaded.gpu == fixture_recording.gpu and loaded.arch == "sm_90"
    assert loaded.note == "test fixture (stand-in model)"
    for name, problem in fixture_recording.pairs():
        original = dict((tuple(c.items()), r) for c, r in fixture_recording.results(name, problem))
        again = dict((tuple(c.items()), r) for c, r in loaded.results(name, problem))
        assert again == original and original
    assert [e.problem for e in loaded.problems] == [P1, P2]
    assert loaded.problem(P1).baseline_result().gflops == pytest.approx(18_000.0)
    # the same recording gives the same bytes (reviewable diffs)
    assert fixture_recording.save(tmp_path / "again.json.gz").read_bytes() == path.read_bytes()


def test_header_says_how_configs_were_chosen(fixture_recording, tmp_path):
    naive, bt1d = fixture_recording.families["naive"], fixture_recording.families["blocktile1d"]
    assert naive.selection.mode == "full" and naive.selection.recorded == len(NAIVE.accepted_configs())
    assert naive.selection.text == f"full accepted space of the grid ({naive.selection.accepted} configs)"
    assert bt1d.selection.mode == "sample" and bt1d.selection.recorded == 100
    assert bt1d.selection.text == (f"uniform sample of 100 of {len(BLOCKTILE1D.accepted_configs())} "
                                   "accepted configs of the grid, seed 7")
    assert naive.params == tuple(p.name for p in NAIVE.params)
    assert naive.source_hash == NAIVE.source_hash
    data = json.loads(gzip.decompress(fixture_recording.save(tmp_path / "r.json.gz").read_bytes()))
    assert "uniform sample of 100" in data["families"]["blocktile1d"]["selection"]["text"]
    # configs are value rows in parameter order; names appear once, in the header
    row = data["problems"][0]["results"]["naive"][0]
    assert len(row) == len(NAIVE.params) + len(RESULT_FIELDS)
    assert data["result_fields"] == list(RESULT_FIELDS)


def test_results_are_what_the_evaluator_measured(fixture_recording):
    for config, result in fixture_recording.results("naive", P2):
        if _fault(config):
            assert result.state == "wrong_result" and result.gflops is None
        else:
            assert result.state == "ok"
            assert result.gflops == pytest.approx(model_gflops(NAIVE, config, P2))
            assert result.registers == 64 and result.occupancy == 0.5
    config, gflops = fixture_recording.optimum("naive", P2)
    assert gflops == max(model_gflops(NAIVE, c, P2) for c in NAIVE.accepted_configs() if not _fault(c))


def test_grid_narrowing_and_its_errors():
    grid = parse_grid(["naive:BX=32,16", "naive:COALESCED=1"], [NAIVE])
    assert grid == {"naive": {"BX": (16, 32), "COALESCED": (1,)}}
    header, configs = choose_configs(NAIVE, grid["naive"], 1000, 0, "sm_90")
    assert configs and all(c["BX"] in (16, 32) and c["COALESCED"] == 1 for c in configs)
    assert header.grid["BY"] == NAIVE.params[1].values and header.selection.mode == "full"
    for text, words in [("naive:BX=7", "allowed: [8, 16"), ("naive:NOPE=1", "its parameters: BX"),
                        ("smem:TILE=8", "not swept"), ("naive-BX=8", "FAMILY:PARAM")]:
        with pytest.raises(ValueError, match=words.replace("[", r"\[")):
            parse_grid([text], [NAIVE])


def _valid_json(recording) -> dict:
    return json.loads(json.dumps(recording.to_json()))


@pytest.mark.parametrize("spoil, words", [
    (lambda d: d.update(format="something-else"), "format"),
    (lambda d: d.update(version=99), "version 99 is not supported"),
    (lambda d: d["problems"][0]["results"]["naive"][0].pop(), "values, expected"),
    (lambda d: d["problems"][0]["results"]["naive"][0].__setitem__(0, 7), "BX=7 is not in the recorded grid"),
    (lambda d: d["problems"][0]["results"]["naive"][0].__setitem__(3, "exploded"), "state 'exploded' is not allowed"),
    (lambda d: d["problems"][0]["results"]["naive"][1].__setitem__(3 + 6, None), "state ok needs a positive gflops"),
    (lambda d: d["problems"][0]["results"]["naive"].append(list(d["problems"][0]["results"]["naive"][0])), "appears twice"),
    (lambda d: d["problems"][0]["results"].update(ghost=[]), "family 'ghost'"),
    (lambda d: d["families"]["naive"]["grid"].pop("BY"), "grid names"),
    (lambda d: d["gpu"].pop("uuid"), "gpu.uuid"),
])
def test_bad_recordings_are_refused_naming_the_fault(fixture_recording, spoil, words):
    data = _valid_json(fixture_recording)
    from_json(data)  # unspoiled: fine
    spoil(data)
    with pytest.raises(RecordingError, match=words):
        from_json(data, "spoiled.json.gz")


def test_unreadable_files_name_the_file(tmp_path):
    with pytest.raises(RecordingError, match="cannot read recording"):
        load(tmp_path / "absent.json.gz")
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(RecordingError, match="junk.json.gz: not a gzip-compressed"):
        load(junk)


def _real_recordings() -> list[Path]:
    return sorted(RECORDINGS.glob("*.json.gz"))


@pytest.mark.skipif(not _real_recordings(),
                    reason=f"no real recordings in {RECORDINGS} yet (made on a GPU host with "
                           "python -m tuner.record)")
@pytest.mark.parametrize("path", _real_recordings(), ids=lambda p: p.name)
def test_real_recordings_are_valid_and_describe_current_families(path):
    recording = load(path)
    assert recording.pairs(), "a recording without results"
    for name, header in recording.families.items():
        family = kernels.get_family(name)
        assert header.params == tuple(p.name for p in family.params)
        # a value the family has dropped since (wgmma's FLUSH = 2) may stay in the recorded grid:
        # the replay narrows the grid to the family's values, so each parameter must keep one
        for p, values in zip(family.params, header.grid.values()):
            assert set(values) & set(p.values), f"{name}: no recorded {p.name} is allowed now"
    for name, problem in recording.pairs():
        assert recording.optimum(name, problem) is not None, f"{name} {problem}: nothing ok"
        assert recording.problem(problem).baseline_result() is not None
