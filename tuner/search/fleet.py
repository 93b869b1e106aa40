"""Several tuner processes sharing one study through the Optuna storage.

Each worker searches on an in-memory copy of the study (tuner.search.study). This module is its view
of the stored study:

* ``SharedStudy.pull()`` reads what changed in the storage since the last look (trials added
  by others, and the ones it saw running or waiting), one incremental query;
* with claims on, a candidate is registered in the storage as a RUNNING trial before it is
  measured (``claim``), kept alive by a heartbeat (``Heartbeat``), and finished in place
  (``finish``), so other workers see it in flight and skip it; two workers that claim the same
  config at once resolve it by trial id (the lower one measures);
* a claim whose heartbeat is older than the stale-after time belongs to a dead worker: Optuna's
  ``fail_stale_trials`` fails it and the storage's retry callback queues a WAITING copy, which
  the next worker with room takes (``take_waiting``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.problem import ConfigKey
from tuner.search import trialrows

log = logging.getLogger(__name__)

OPEN_STATES = (TrialState.RUNNING, TrialState.WAITING)
# System attribute of a claim: which process holds it ("host/pid"), written with the claim (no
# extra commit) and rewritten by a worker that takes it as a queued retry, so that an operator
# or bench/shared_study.py can tell whose a running trial is.
WORKER_ATTR = "worker"


def worker_id(pid: int | None = None) -> str:
    """How a claim names its worker: this process, or the process ``pid`` on this host."""
    return f"{socket.gethostname()}/pid{os.getpid() if pid is None else pid}"


def heartbeats_on(storage: BaseStorage) -> bool:
    """Whether the storage keeps trial heartbeats (tuner.run.storage.open_storage makes such)."""
    interval = getattr(storage, "get_heartbeat_interval", None)
    return interval is not None and interval() is not None


@dataclass
class Changes:
    """What ``pull`` found: trials that finished since the last look (COMPLETE ones to learn
    from, and FAILed claims that were in flight), and the other workers' open trials now."""

    completed: list[FrozenTrial] = field(default_factory=list)
    failed: list[FrozenTrial] = field(default_factory=list)
    started: list[FrozenTrial] = field(default_factory=list)  # others' new RUNNING claims


class SharedStudy:
    """One worker's handle on a stored study."""

    def __init__(self, storage: BaseStorage, name: str, *,
                 key_of: Callable[[FrozenTrial], ConfigKey], claims: bool,
                 stale_check_every_s: float) -> None:
        self.storage = storage
        self.key_of = key_of  # a stored trial's config identity (params hold positions)
        self.study = optuna.create_study(storage=storage, study_name=name, direction="maximize",
                                         load_if_exists=True)
        self.study_id = storage.get_study_id_from_name(name)
        self.claims = claims and heartbeats_on(storage)
        self.stale_check_every_s = stale_check_every_s
        self._next_stale_check = 0.0
        self._last_id = -1
        self.others_open: dict[int, FrozenTrial] = {}  # RUNNING/WAITING trials not ours, by id
        self.own: set[int] = set()  # ids this worker wrote (it knows them already)
        self.mine_running: set[int] = set()  # our claims in flight: the heartbeat keeps them
        self._lock = threading.Lock()  # mine_running is read by the heartbeat thread

    # ------------------------------------------------------------------ reading

    def pull(self) -> Changes:
        """Trials added or changed in the storage since the last call (the first call: all)."""
        self._fail_stale()
        trials = self._trials_since(self._last_id, set(self.others_open))
        changes = Changes()
        for trial in trials:
            self._last_id = max(self._last_id, trial._trial_id)
            if trial._trial_id in self.own:
                continue
            was_open = self.others_open.pop(trial._trial_id, None)
            if trial.state in OPEN_STATES:
                self.others_open[trial._trial_id] = trial
                if trial.state == TrialState.RUNNING and (
                        was_open is None or was_open.state != TrialState.RUNNING):
                    changes.started.append(trial)
            elif trial.state == TrialState.COMPLETE:
                changes.completed.append(trial)
            elif was_open is not None:
                changes.failed.append(trial)
        return changes

    def _trials_since(self, last_id: int, watched: set[int]) -> list[FrozenTrial]:
        """Trials with an id above last_id, and those in watched, in id order."""
        incremental = getattr(self.storage, "_get_trials", None)
        if incremental is not None:  # RDBStorage: one query for just these (as Optuna's cache)
            return incremental(self.study_id, None, watched, last_id)
        return [t for t in self.storage.get_all_trials(self.study_id, deepcopy=False)
                if t._trial_id > last_id or t._trial_id in watched]

    def _fail_stale(self) -> None:
        if not heartbeats_on(self.storage) or time.monotonic() < self._next_stale_check:
            return
        self._next_stale_check = time.monotonic() + self.stale_check_every_s
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # type: ignore[attr-defined]

    def waiting(self) -> list[FrozenTrial]:
        """Queued retries of dead workers' candidates, oldest first."""
        return [t for i, t in sorted(self.others_open.items()) if t.state == TrialState.WAITING]

    # ------------------------------------------------------------------ writing

    def add_finished(self, trial: FrozenTrial) -> int:
        """Store a finished trial in one transaction; returns its number in the storage."""
        if trialrows.usable(self.storage):
            trial_id, number = trialrows.insert_trial(self.storage, self.study_id, trial)
            self.own.add(trial_id)
            return number
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=trial)
        self.own.add(trial_id)
        return self.storage.get_trial_number_from_id(trial_id)

    def claim(self, params: dict[str, int], distributions: dict[str, BaseDistribution]) -> int:
        """Register a candidate as RUNNING with its first heartbeat, in one transaction
        (``trialrows.insert_trial``); returns its trial id. Optuna never fails a RUNNING trial
        without a heartbeat as stale, so the two are written together: a worker killed at any
        moment leaves no claim or one that goes stale (docs/fleet.md, "Claims and the constant
        liar"). The caller pulls next and asks ``claimed_before``: two workers may claim one
        config at the same moment."""
        template = create_trial(state=TrialState.RUNNING, params=params,
                                distributions=distributions,
                                system_attrs={WORKER_ATTR: worker_id()})
        trial_id, _ = trialrows.insert_trial(self.storage, self.study_id, template,  # type: ignore[arg-type]
                                             heartbeat=True)
        self.own.add(trial_id)
        self._keep_alive(trial_id)
        return trial_id

    def _turn_running(self, trial_id: int) -> bool:
        """WAITING → RUNNING, atomic in the storage; False where another worker took the trial
        first, or took it and finished it already (the storage then refuses the update)."""
        try:
            return self.storage.set_trial_state_values(trial_id, TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False

    def claimed_before(self, key: ConfigKey, trial_id: int) -> bool:
        """Whether another open trial of the same config has a lower trial id: a claim, or a
        dead worker's queued retry (WAITING, which its taker turns into a claim under the same
        id). Of all open trials of one config, the lowest id is measured and the others back
        off. Ids are handed out in commit order, so of two racing trials the later one sees the
        earlier after its pull: exactly one of them measures. (Counting only claims, a claim
        made while a stale claim's retry was being queued and the retry's taker both measured
        the config: 31 measurements of a budget of 30 in CI.)"""
        return any(i < trial_id and self.key_of(t) == key for i, t in self.others_open.items())

    def take_waiting(self, trial: FrozenTrial) -> bool:
        """Take a queued retry (WAITING → RUNNING); False: someone else took it first (and may
        have measured it since this worker's last pull). Its first heartbeat goes before the
        turn, as a claim's does (``claim`` says why)."""
        self._start_heartbeat(trial._trial_id)
        if not self._turn_running(trial._trial_id):
            self._stop_heartbeat(trial._trial_id)
            return False
        # the trial still names the worker whose claim went stale: name its taker instead
        self.storage.set_trial_system_attr(trial._trial_id, WORKER_ATTR, worker_id())
        self.others_open.pop(trial._trial_id, None)
        self.own.add(trial._trial_id)
        return True

    def finish(self, trial_id: int, finished: FrozenTrial) -> int:
        """Complete our claim with the in-memory trial's value and attributes, in one
        transaction; returns its number. If a slow heartbeat let another worker fail the claim
        meanwhile, the result is stored as a new trial instead (nothing measured is lost)."""
        self._stop_heartbeat(trial_id)
        try:
            return trialrows.complete_trial(self.storage, trial_id, finished)  # type: ignore[arg-type]
        except optuna.exceptions.UpdateFinishedTrialError:
            log.warning("claim %d was failed as stale while it was being measured (heartbeat "
                        "too slow for --stale-after?); storing the result as a new trial",
                        trial_id)
            return self.add_finished(finished)

    def release(self, trial_id: int, *, requeue: bool) -> None:
        """Give up a claim that was never measured: back to WAITING (a retry someone else
        should take) or FAIL (the config becomes free for any sampler to propose again)."""
        self._stop_heartbeat(trial_id)
        state = TrialState.WAITING if requeue else TrialState.FAIL
        try:
            self.storage.set_trial_state_values(trial_id, state)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # already failed as stale by another worker
        if requeue:
            self.own.discard(trial_id)  # someone else's to take now: watch it like theirs
            self.others_open[trial_id] = self.storage.get_trial(trial_id)

    # ------------------------------------------------------------------ heartbeats

    def _start_heartbeat(self, trial_id: int) -> None:
        self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        self._keep_alive(trial_id)

    def _keep_alive(self, trial_id: int) -> None:
        """Beat for this trial from now on (``beat``, the heartbeat thread)."""
        with self._lock:
            self.mine_running.add(trial_id)

    def _stop_heartbeat(self, trial_id: int) -> None:
        with self._lock:
            self.mine_running.discard(trial_id)

    def beat(self) -> None:
        with self._lock:
            ids = sorted(self.mine_running)
        for trial_id in ids:
            self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]


class Heartbeat:
    """A daemon thread that calls each of ``beats`` every ``interval_s`` seconds until stopped;
    a failing beat is logged and tried again next time (the database may be restarting)."""

    def __init__(self, interval_s: float, beats: Iterable[Callable[[], Any]]) -> None:
        self.interval_s = interval_s
        self.beats = list(beats)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gemmtune-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for beat in self.beats:
                try:
                    beat()
                except Exception as error:  # noqa: BLE001  keep beating; the next may work
                    log.warning("heartbeat failed: %s", error)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
