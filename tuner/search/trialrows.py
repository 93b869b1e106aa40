"""Trials written to an Optuna ``RDBStorage`` in one transaction each, with a statement per
table instead of Optuna's queries per row.

Optuna's ``create_new_trial`` with a template trial writes each param with two look-ups (the
trial, and a previous distribution of that name to check against) and each attribute with one:
34 statements and ~9 ms of Python for a claim of a nine-param config on PostgreSQL, and more
for a finished trial with its attributes. The searches of this tuner ask only configs of one
family's fixed distributions, so the checks have nothing to find; these functions write the
same rows as Optuna (read back by its own ``get_trial``, identical: tests/test_tuner_trialrows.py)
with one insert per table. A claim is written RUNNING with its first heartbeat in the same
transaction, so that a worker killed at any moment leaves either no trial or one that goes
stale (docs/fleet.md, "Claims and the constant liar"). The tables are Optuna's models
(``optuna.storages._rdb.models``), of the installed version, whose schema Optuna checks when
the storage opens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import distribution_to_json
from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Connection, delete, func, insert, select, update

_TRIALS = models.TrialModel.__table__
_PARAMS = models.TrialParamModel.__table__
_VALUES = models.TrialValueModel.__table__
_USER_ATTRS = models.TrialUserAttributeModel.__table__
_SYSTEM_ATTRS = models.TrialSystemAttributeModel.__table__
_HEARTBEATS = models.TrialHeartbeatModel.__table__
_STUDIES = models.StudyModel.__table__


def usable(storage: Any) -> bool:
    """Whether ``storage`` is an RDBStorage (the tuner's, tuner.run.storage.open_storage)."""
    return isinstance(storage, RDBStorage)


def insert_trial(storage: RDBStorage, study_id: int, trial: FrozenTrial, *,
                 heartbeat: bool = False) -> tuple[int, int]:
    """Store ``trial`` (its state, params, values and attributes) as a new trial of the study,
    with a first heartbeat where ``heartbeat``; returns its trial id and number."""
    with storage.engine.begin() as conn:
        # Optuna's lock: a trial's number is the count of the study's trials before it
        conn.execute(select(_STUDIES.c.study_id).where(_STUDIES.c.study_id == study_id)
                     .with_for_update())
        trial_id = conn.execute(insert(_TRIALS).values(
            study_id=study_id, number=None, state=trial.state,
            datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete)).inserted_primary_key[0]
        number = conn.execute(select(func.count()).select_from(_TRIALS).where(
            _TRIALS.c.study_id == study_id, _TRIALS.c.trial_id < trial_id)).scalar_one()
        conn.execute(update(_TRIALS).where(_TRIALS.c.trial_id == trial_id).values(number=number))
        if trial.params:
            conn.execute(insert(_PARAMS), [
                {"trial_id": trial_id, "param_name": name,
                 "param_value": trial.distributions[name].to_internal_repr(value),
                 "distribution_json": distribution_to_json(trial.distributions[name])}
                for name, value in trial.params.items()])
        _write_values(conn, trial_id, trial.values)
        _write_attrs(conn, _USER_ATTRS, trial_id, trial.user_attrs, replace=False)
        _write_attrs(conn, _SYSTEM_ATTRS, trial_id, trial.system_attrs, replace=False)
        if heartbeat:
            conn.execute(insert(_HEARTBEATS).values(trial_id=trial_id, heartbeat=func.now()))
    return trial_id, number


def complete_trial(storage: RDBStorage, trial_id: int, finished: FrozenTrial) -> int:
    """Finish a RUNNING trial in place with ``finished``'s values and attributes (set over
    those it has); returns its number. Raises ``optuna.exceptions.UpdateFinishedTrialError``
    where it is no longer RUNNING (another worker failed it as stale), as Optuna does."""
    with storage.engine.begin() as conn:
        row = conn.execute(select(_TRIALS.c.state, _TRIALS.c.number)
                           .where(_TRIALS.c.trial_id == trial_id).with_for_update()).one()
        if row.state != TrialState.RUNNING:
            raise optuna.exceptions.UpdateFinishedTrialError(
                f"trial {trial_id} is {row.state.name}, not RUNNING: it cannot be completed")
        _write_values(conn, trial_id, finished.values)
        _write_attrs(conn, _USER_ATTRS, trial_id, finished.user_attrs, replace=True)
        _write_attrs(conn, _SYSTEM_ATTRS, trial_id, finished.system_attrs, replace=True)
        conn.execute(update(_TRIALS).where(_TRIALS.c.trial_id == trial_id).values(
            state=finished.state, datetime_complete=datetime.now()))
    return int(row.number)


def _write_values(conn: Connection, trial_id: int, values: list[float] | None) -> None:
    if not values:
        return
    rows = []
    for objective, value in enumerate(values):
        stored, kind = models.TrialValueModel.value_to_stored_repr(value)
        rows.append({"trial_id": trial_id, "objective": objective, "value": stored,
                     "value_type": kind})
    conn.execute(insert(_VALUES), rows)


def _write_attrs(conn: Connection, table: Any, trial_id: int, attrs: Mapping[str, Any], *,
                 replace: bool) -> None:
    if not attrs:
        return
    if replace:  # Optuna's set_trial_*_attr overwrites a key the trial has
        conn.execute(delete(table).where(table.c.trial_id == trial_id,
                                         table.c.key.in_(list(attrs))))
    conn.execute(insert(table), [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                                 for key, value in attrs.items()])
