"""CPU time of a sampler's ask over a family's full accepted space (issue 19).

    python bench/ask_cost.py [--sampler prior|model] [--family pipelined ...] [--asks 50]
                             [--window 4] [--profile]

For each family (default: the enumerable ones with more than 10,000 accepted configs), builds
the sampler as a study does at 2048³ on 132 SMs — ``prior``: the TPE set-up (accepted configs,
geometry groups; no prior start-up); ``model``: the learned cost model on a cold database (no
examples of other problems, no start-up: it fits on the study's own values once it has a few)
— and asks ``--asks`` times with ``--window`` candidates in flight, telling a made-up value for
the oldest. Prints the mean ms per ask after the first 10 (past the start-up) and a digest of
the proposals: a change of the ask that must not change the search keeps the digest. No GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
import optuna  # noqa: E402

from tuner.problem import Problem  # noqa: E402
from tuner.search import prior, space  # noqa: E402
from tuner.search.samplers import SearchSpace, make_sampler  # noqa: E402
from tuner.search.study import _accepted_configs  # noqa: E402

ARCH = "sm_90"
WARM_ASKS = 10
LARGE = ("warptile", "pipelined", "tf32x3")


def _value(config: dict[str, int]) -> float:
    """A made-up objective: deterministic, with some structure for TPE to follow."""
    return float(sum((i + 1) * (v % 7) for i, v in enumerate(config.values())))


def ask_cost(family_name: str, asks: int, window: int, profile: cProfile.Profile | None = None,
             sampler_name: str = "prior") -> tuple[int, float, str]:
    """(accepted configs, mean seconds per ask after the first WARM_ASKS, proposals digest)."""
    family = kernels.get_family(family_name)
    accepted = _accepted_configs(family, ARCH)
    if accepted is None:
        raise SystemExit(f"{family_name}: not enumerable")
    distributions = space.distributions(family)
    if sampler_name == "model":
        from tuner.search.costmodel import preload
        from tuner.search.learned import LearnedSpace

        preload()  # the tuner imports it before its studies (tuner.run.tune)
        learned = LearnedSpace.build(family, accepted, space.params_from_configs(family, accepted),
                                     Problem(2048, 2048, 2048), prior.Target(132, ARCH), [])
        search_space = SearchSpace(distributions, space.feasibility(family, ARCH), learned=learned)
    else:
        groups = prior.group_configs(family, accepted, 2048, 2048, 2048)
        positions = [[space.params_from_config(family, c) for c in members]
                     for _, members in groups.values()]
        search_space = SearchSpace(distributions, space.feasibility(family, ARCH), (), positions)
    sampler = make_sampler(sampler_name, 0, search_space)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    asked, seconds = propose(study, family, asks, window, _value, profile)
    late = seconds[WARM_ASKS:] or seconds
    return len(accepted), sum(late) / len(late), digest(asked)


def propose(study: optuna.Study, family: Any, asks: int, window: int,
            value: Callable[[dict[str, int]], float], profile: cProfile.Profile | None = None
            ) -> tuple[list[tuple[tuple[str, int], ...]], list[float]]:
    """Ask ``asks`` times with ``window`` candidates in flight (constant liar sees RUNNING
    trials), telling the oldest ``value(config)``: the proposals (sorted config items) and the
    seconds of each ask (profiled after the first WARM_ASKS)."""
    distributions = space.distributions(family)
    seconds, asked, in_flight = [], [], []
    for index in range(asks):
        started = time.perf_counter()
        if profile is not None and index >= WARM_ASKS:
            profile.enable()
        trial = study.ask(distributions)
        if profile is not None:
            profile.disable()
        seconds.append(time.perf_counter() - started)
        config = space.config_from_params(family, trial.params)
        asked.append(tuple(sorted(config.items())))
        trial.set_user_attr("state", "ok")
        in_flight.append((trial, config))
        if len(in_flight) >= window:
            done, done_config = in_flight.pop(0)
            study.tell(done, value(done_config))
    return asked, seconds


def digest(asked: list[tuple[tuple[str, int], ...]]) -> str:
    return hashlib.sha256(repr(asked).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampler", choices=("prior", "model"), default="prior")
    parser.add_argument("--family", action="append", default=[])
    parser.add_argument("--asks", type=int, default=50)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="cProfile the asks")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in args.family or LARGE:
        profile = cProfile.Profile() if args.profile else None
        accepted, per_ask, digest = ask_cost(name, args.asks, args.window, profile, args.sampler)
        print(f"{name}: {accepted} accepted configs, {1e3 * per_ask:.1f} ms per ask, "
              f"proposals {digest}")
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
