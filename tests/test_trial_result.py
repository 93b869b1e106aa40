"""One definition of a trial's result: ``db.TRIAL_RESULT`` (names, types as stored, units).

Every other spelling of it is held against that table here: the database's TrialRecord and
Trial, the tuner's Measurement, the recording format's columns (and the recordings on disk),
and the API's TrialOut."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import db
import pytest

from api.schemas import TrialOut
from tuner.measure import evaluator
from tuner.measure.evaluator import Measurement
from tuner.measure.recording import BUNDLED_RECORDINGS, GPU_FIELDS, RECORDED_STATES, RESULT_FIELDS, RecordedResult, load

ROOT = Path(__file__).resolve().parents[1]
NAMES = [f.name for f in db.TRIAL_RESULT]
# The clock as measured (a float); the study rounds it to whole MHz when it stores the trial.
WIDER_IN_MEASUREMENT = {"sm_clock_mhz": float}


def stored_type(field: db.ResultField) -> object:
    return field.type if field.name == "state" else field.type | None


def hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def test_the_table_names_each_field_once_with_a_type_and_a_unit_where_it_has_one():
    assert len(set(NAMES)) == len(NAMES) and NAMES[0] == "state"
    assert all(f.type in (str, int, float) and f.meaning for f in db.TRIAL_RESULT)
    units = {f.name: f.unit for f in db.TRIAL_RESULT}
    # the names that carry a unit say it, and the table agrees
    assert all(units[n] == "ms" for n in NAMES if n.endswith("_ms"))
    assert units["sm_clock_mhz"] == "MHz" and units["compile_seconds"] == "s"
    assert all(units[n].startswith("bytes") for n in NAMES if n.endswith("_bytes"))


def test_the_database_records_carry_exactly_the_result_fields():
    record = [f.name for f in dataclasses.fields(db.TrialRecord)]
    assert record == ["number", "params", *NAMES, "started_at"]
    stored = [f.name for f in dataclasses.fields(db.Trial)]
    assert stored == ["id", "run_id", "number", "params", *NAMES, "started_at", "recorded_at",
                      "timings"]
    for field in db.TRIAL_RESULT:
        assert hints(db.TrialRecord)[field.name] == stored_type(field), field.name
        assert hints(db.Trial)[field.name] == stored_type(field), field.name


def test_the_tuners_measurement_is_the_result():
    assert [f.name for f in dataclasses.fields(Measurement)] == NAMES
    for field in db.TRIAL_RESULT:
        wanted = WIDER_IN_MEASUREMENT.get(field.name, field.type)
        assert hints(Measurement)[field.name] == (wanted if field.name == "state"
                                                  else wanted | None), field.name
    states = {getattr(evaluator, name) for name in dir(evaluator)
              if name.isupper() and isinstance(getattr(evaluator, name), str)}
    assert states == set(db.TRIAL_STATES)
    assert set(RECORDED_STATES) <= set(db.TRIAL_STATES)


def test_the_recording_format_holds_the_result_plus_its_relative_error():
    assert sorted(RESULT_FIELDS) == sorted([*NAMES, "rel_error"])
    assert [f.name for f in dataclasses.fields(RecordedResult)] == [*NAMES, "rel_error"]
    assert list(GPU_FIELDS) == [f.name for f in dataclasses.fields(db.GpuInfo)]


@pytest.mark.parametrize("path", sorted([*BUNDLED_RECORDINGS.glob("*.json.gz"),
                                         *(ROOT / "bench/data").glob("*.json.gz")]),
                         ids=lambda p: p.name)
def test_recordings_on_disk_still_load_into_trial_records(path):
    recording = load(path)
    for name, problem in recording.pairs():
        for number, (config, result) in enumerate(recording.results(name, problem)):
            measured = result.measurement()
            assert type(measured) is Measurement
            fields = dataclasses.asdict(measured)
            if fields["sm_clock_mhz"] is not None:
                fields["sm_clock_mhz"] = round(fields["sm_clock_mhz"])
            if not measured.usable and fields["state"] == "ok":
                continue  # the study stores such a one as wrong_result (tuner.search.study)
            db.TrialRecord(number=number, params=config, **fields)  # validates every field


def test_the_api_trial_schema_carries_the_result_fields_with_their_types():
    fields = TrialOut.model_fields
    assert [name for name in fields if name in NAMES] == NAMES
    for field in db.TRIAL_RESULT:
        assert fields[field.name].annotation == stored_type(field), field.name
