"""tuner.search.trialrows writes the rows Optuna's own calls write: read back through Optuna's
``get_trial``, a trial stored or completed by either path is the same (SQLite, and PostgreSQL
where $GEMMTUNE_TEST_PG_URL names a server)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from db.testing import postgres_available, scratch_url
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.run.storage import open_storage
from tuner.search import trialrows

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not postgres_available(), reason="needs GEMMTUNE_TEST_PG_URL (source .ci/postgres.sh)"))]

DISTRIBUTIONS = {"BM": IntDistribution(0, 7), "split": IntDistribution(1, 64, log=True),
                 "ratio": FloatDistribution(0.0, 1.0), "order": CategoricalDistribution(["a", "b"])}
PARAMS = {"BM": 3, "split": 16, "ratio": 0.25, "order": "b"}


def _finished(value: float) -> FrozenTrial:
    trial = create_trial(state=TrialState.COMPLETE, value=value, params=PARAMS,
                         distributions=DISTRIBUTIONS,
                         user_attrs={"state": "ok", "error": "", "median_ms": 0.125,
                                     "clocks": [1980, 1755], "note": {"nested": True}},
                         system_attrs={"worker": "host/pid1"})
    trial.set_constraint(0, -1.0)  # stored as a system attribute, as the tuner's trials are
    return trial


def _same(a: FrozenTrial, b: FrozenTrial) -> None:
    for field in ("state", "values", "params", "distributions", "user_attrs", "system_attrs",
                  "intermediate_values"):
        assert getattr(a, field) == getattr(b, field), field
    assert a.datetime_complete is not None and b.datetime_complete is not None


@pytest.fixture(params=BACKENDS)
def storage(request, tmp_path: Path):
    with scratch_url(request.param, tmp_path) as url:
        opened = open_storage(url, heartbeat_s=1.0, stale_after_s=5.0)
        try:
            yield opened
        finally:
            opened.engine.dispose()


def test_a_finished_trial_reads_back_as_optunas_own(storage) -> None:
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")
    by_optuna = storage.create_new_trial(study_id, template_trial=_finished(2.5))
    for value in (2.5, math.inf, -math.inf):
        trial_id, number = trialrows.insert_trial(storage, study_id, _finished(value))
        stored = storage.get_trial(trial_id)
        assert stored.number == number == storage.get_trial_number_from_id(trial_id)
        expected = storage.get_trial(by_optuna)
        expected.values = [value]
        _same(stored, expected)
    assert [t.number for t in storage.get_all_trials(study_id)] == [0, 1, 2, 3]


def test_a_claim_completed_in_place_reads_back_as_optunas_own(storage) -> None:
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")
    finished = _finished(7.0)
    running = create_trial(state=TrialState.RUNNING, params=PARAMS, distributions=DISTRIBUTIONS,
                           system_attrs={"worker": "host/pid1"})

    by_optuna = storage.create_new_trial(study_id, template_trial=running)
    for name, value in finished.user_attrs.items():
        storage.set_trial_user_attr(by_optuna, name, value)
    for name, value in finished.system_attrs.items():
        storage.set_trial_system_attr(by_optuna, name, value)
    storage.set_trial_state_values(by_optuna, TrialState.COMPLETE, finished.values)

    claim, number = trialrows.insert_trial(storage, study_id, running, heartbeat=True)
    assert storage.get_trial(claim).state == TrialState.RUNNING
    assert trialrows.complete_trial(storage, claim, finished) == number == 1
    _same(storage.get_trial(claim), storage.get_trial(by_optuna))


def test_a_trial_no_longer_running_is_not_completed(storage) -> None:
    """Another worker failed the claim as stale: the completion is refused, as Optuna's is,
    and the failed trial is left as it was."""
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")
    running = create_trial(state=TrialState.RUNNING, params=PARAMS, distributions=DISTRIBUTIONS)
    claim, _ = trialrows.insert_trial(storage, study_id, running, heartbeat=True)
    storage.set_trial_state_values(claim, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError, match="FAIL"):
        trialrows.complete_trial(storage, claim, _finished(1.0))
    failed = storage.get_trial(claim)
    assert failed.state == TrialState.FAIL and failed.values is None and not failed.user_attrs
