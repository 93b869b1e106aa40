"""Argument checks shared by writes and queries; each failure names the value and what is allowed."""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import bad_value
from .states import DTYPES, LAYOUTS, RUN_STATES, TRIAL_STATES

MAX_LIMIT = 10_000


def positive_int(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise bad_value(what, value, "a positive int")
    return value


def positive_number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise bad_value(what, value, "a finite number > 0")
    return float(value)


def shape(m: Any, n: Any, k: Any) -> tuple[int, int, int]:
    return positive_int("m", m), positive_int("n", n), positive_int("k", k)


def batch(value: Any) -> int:
    return positive_int("batch", value)


def problem_kind(dtype: Any, layout: Any, general_alpha_beta: Any) -> None:
    if dtype not in DTYPES:
        raise bad_value("dtype", dtype, DTYPES)
    if layout not in LAYOUTS:
        raise bad_value("layout", layout, LAYOUTS)
    if not isinstance(general_alpha_beta, bool):
        raise bad_value("general_alpha_beta", general_alpha_beta, (True, False))


def trial_state(state: Any, *, optional: bool = False) -> None:
    if optional and state is None:
        return
    if state not in TRIAL_STATES:
        raise bad_value("trial state", state, TRIAL_STATES)


def run_state(state: Any, allowed: tuple[str, ...] = RUN_STATES, *, optional: bool = False) -> None:
    if optional and state is None:
        return
    if state not in allowed:
        raise bad_value("run state", state, allowed)


def paging(offset: Any, limit: Any) -> tuple[int, int]:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise bad_value("offset", offset, "an int >= 0")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise bad_value("limit", limit, f"an int in 1..{MAX_LIMIT}")
    return offset, limit


def stale_after(seconds: Any) -> float:
    """A heartbeat age after which a worker is taken as dead: positive, finite seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (math.isfinite(seconds) and seconds > 0):
        raise bad_value("stale_after_s", seconds, "a positive number of seconds")
    return float(seconds)


def text(what: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise bad_value(what, value, "a non-empty string")


def names(what: str, value: Any) -> frozenset[str] | None:
    """An optional collection of non-empty strings (a filter: None means no filter)."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) and v.strip() for v in value):
        raise bad_value(what, value, "a collection of non-empty strings (not one string), or None")
    return frozenset(value)


def json_dict(what: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_value(what, value, "a JSON-serialisable dict")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise bad_value(what, value, f"a JSON-serialisable dict ({exc})") from exc
    return value
