"""One tuner invocation: a cuBLAS baseline per shape, then a study per (shape, family)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import kernels
from tuner.measure.evaluator import Baseline, tickets
from tuner.measure.recording import bundled
from tuner.problem import Problem
from tuner.report import config_text, format_table
from tuner.run.retime import refresh_bests, retime_shape
from tuner.search.prefetch import StartupPrefetch
from tuner.search.study import Budget, Session, Startup, StudyOutcome, StudyRun, ranks_prior
from tuner.search.warmstart import warm_start

log = logging.getLogger(__name__)

# With a shared time budget, a study still gets this long even when earlier ones overran.
MIN_STUDY_SECONDS = 5.0
# Warm starts posted ahead of their studies: the next study's, then the later ones' while fewer
# than this many posted configs are unanswered: GPU work while a study is built (its start-up,
# storage and model view: 0.3-2 s with the GPU idle; a measurement takes ~0.1 s at the small
# shapes), few enough that a study's own asks do not queue far behind them (docs/measurement.md,
# "Warm starts posted a study ahead").
AHEAD = 12


@dataclass
class Summary:
    outcomes: list[tuple[Problem, Any, StudyOutcome]] = field(default_factory=list)
    baselines: dict[Problem, Baseline] = field(default_factory=dict)
    interrupted: bool = False
    retimed: int = 0  # trials whose figure is the median of several timings (tuner.run.retime)
    retime_rounds: int = 0

    def best(self, problem: Problem) -> tuple[Any, StudyOutcome] | None:
        candidates = [(family, outcome) for p, family, outcome in self.outcomes
                      if p == problem and outcome.best_gflops is not None]
        return max(candidates, key=lambda fo: fo[1].best_gflops, default=None)  # type: ignore

    def table(self) -> str:
        rows = []
        problems = list(dict.fromkeys(p for p, _, _ in self.outcomes))
        for problem in problems:
            best = self.best(problem)
            baseline = self.baselines.get(problem)
            if best is None:
                rows.append([problem.label, "-", "no verified config", "-", "-"])
                continue
            family, outcome = best
            gflops = outcome.best_gflops or 0.0
            fraction = f"{gflops / baseline.gflops:.2f}" if baseline else "-"
            rows.append([problem.label, family.name, config_text(outcome.best_config),
                         f"{gflops:,.0f}", fraction])
        title = "Best kernel per shape" + (" (interrupted)" if self.interrupted else "")
        note = (f"\n(each shape's fastest configs and cuBLAS were timed {self.retime_rounds} more "
                "times in shuffled rounds; the figures are the medians of their timings)"
                if self.retimed else "")
        return title + "\n" + format_table(
            ["shape", "family", "config", "GFLOP/s", "of cuBLAS"], rows) + note

    def settle(self, session: Session, problem: Problem) -> None:
        """Re-time ``problem``'s fastest configs (``tuner.run.retime``) and read its studies'
        bests again."""
        places = [i for i, (p, _, _) in enumerate(self.outcomes) if p == problem]
        studies = [(self.outcomes[i][1], self.outcomes[i][2]) for i in places]
        done = retime_shape(session, problem, studies, session.retime_rounds,
                            self.baselines.get(problem))
        if done.baseline is not None:
            _store_baseline(session, problem, done.baseline)
            self.baselines[problem] = done.baseline
        if not done.retimed:
            return
        for i, outcome in zip(places, refresh_bests(session, studies, done.retimed)):
            self.outcomes[i] = (problem, self.outcomes[i][1], outcome)
        self.retimed += len(done.retimed)
        self.retime_rounds = session.retime_rounds


def _measure_baseline(session: Session, problem: Problem) -> Baseline | None:
    try:
        baseline = session.evaluator.baseline()
    except RuntimeError as error:  # no cuBLAS on this host: tune anyway, without the fraction
        log.warning("no cuBLAS baseline for %s: %s", problem.shape, error)
        return None
    _store_baseline(session, problem, baseline)
    log.info("%s: %s %.0f GFLOP/s", problem.shape, baseline.library, baseline.gflops)
    return baseline


class AheadPosts:
    """What the command hands the GPU ahead of a study, so that it measures while the main
    thread waits for the study's start-up and builds it: the study's warm start (the nearest
    tuned shapes' bests, the declared starting points: asked among its first whatever its
    search; docs/measurement.md, "Shape changes", "Warm starts posted a study ahead"), then,
    once its start-up is in hand, its first asks (docs/measurement.md, "First asks posted
    ahead"). Nothing where this family was measured at this problem before: the study resumes
    and skips its warm start. A study's warm start is looked up once: the bests it reads, of
    other problems and GPUs, do not change while this command runs the shape's studies before
    it (looked up again at every boundary, the later studies' held the GPU ~0.1 s there; where
    other workers measure the study meanwhile, what they measured first is posted for nothing)."""

    def __init__(self, session: Session, trials: int) -> None:
        self.session, self.trials = session, trials
        post = getattr(session.evaluator, "post_ahead", None)
        self.post = post if session.warm_start else None
        self._warm: dict[tuple[str, Problem], list[dict[str, int]] | None] = {}

    def _warm_start(self, family: Any, problem: Problem
                    ) -> tuple[Any, list[dict[str, int]] | None]:
        """The family bound to the problem's layout and batch, and its study's warm start, or
        None where it resumes."""
        bound = kernels.bind(family, problem.layout, problem.batch)
        key = (bound.name, problem)
        if key not in self._warm:
            session = self.session
            same, elsewhere = warm_start(session.database, session.gpu_name, bound, problem,
                                         session.evaluator.arch())
            self._warm[key] = None if same else elsewhere[:self.trials]
        return bound, self._warm[key]

    def warm_starts(self, families: list[Any], problem: Problem) -> None:
        """Before the first of ``families`` (the shape's studies still to be built, in order)
        is built: its warm start, then the later ones' while fewer than AHEAD configs posted
        ahead are unanswered. Posted again, a warm start adds those compiled since."""
        if self.post is None:
            return
        ahead = getattr(self.session.evaluator, "posted_ahead", None)
        for i, family in enumerate(families):
            if i and (ahead is None or ahead() >= AHEAD):
                break
            bound, warm = self._warm_start(family, problem)
            if warm is not None:
                self.post(bound, warm)

    def first_asks(self, family: Any, problem: Problem, startup: Startup | None) -> None:
        """The study's first asks after its warm start (``Startup.first_asks``: the prior's
        ranking or the model's first picks), as many as its first window holds beside the warm
        start: the build (its storage, the model's view, the sampler: 0.5-1.2 s at splitk and
        tf32x3) left the GPU idle where the study before ended with few candidates in flight.
        Not with claims, where each ask is claimed before it is measured."""
        if self.post is None or startup is None or self.session.claim_trials:
            return
        bound, warm = self._warm_start(family, problem)
        if warm is not None:
            asks = self._beside(warm, startup)
            if asks:
                self.post(bound, asks)

    def while_waiting(self, later: list[tuple[Any, Startup | None]], problem: Problem) -> None:
        """While the running study waits for a compile with none of its candidates on the GPU:
        the shape's later studies' first configs (``later``: each family in order with its
        start-up where prepared; their warm start, then their first asks, as ``first_asks``
        posts them) whose compiles are done, as many as the evaluator takes at once, and only
        once every earlier post was answered, so that the running study's next candidate
        queues behind a few at most. The later study asks them first and takes their answers
        (docs/measurement.md, "Later studies' first asks while a study waits"). Not with
        claims."""
        evaluator = self.session.evaluator
        post = getattr(evaluator, "post_compiled", None)
        unanswered = getattr(evaluator, "posted_ahead", None)
        if (self.post is None or post is None or unanswered is None or self.session.claim_trials
                or unanswered()):
            return
        room = tickets(evaluator)
        for family, startup in later:
            bound, warm = self._warm_start(family, problem)
            if warm is None:
                continue  # it resumes: its asks are not known ahead
            room -= post(bound, warm + self._beside(warm, startup), room)
            if room <= 0:
                return

    def _beside(self, warm: list[dict[str, int]], startup: Startup | None
                ) -> list[dict[str, int]]:
        """The study's first asks not in its warm start, as many as its first window holds
        beside it."""
        window = min(self.session.batch, self.trials)
        asks = [] if startup is None else startup.first_asks(window)
        return [c for c in asks if c not in warm][:max(0, window - len(warm))]


def _store_baseline(session: Session, problem: Problem, baseline: Baseline) -> None:
    """The shape's baseline on this GPU, as the newest (the one fractions of cuBLAS read)."""
    problem_id = session.database.ensure_problem(
        problem.m, problem.n, problem.k, dtype=problem.dtype, layout=problem.layout,
        general_alpha_beta=problem.general_alpha_beta, batch=problem.batch,
    )
    sm_clock = None if baseline.sm_clock_mhz is None else int(round(baseline.sm_clock_mhz))
    session.database.add_baseline(
        gpu_id=session.gpu_id, problem_id=problem_id, library=baseline.library,
        time_median_ms=baseline.time_median_ms, gflops=baseline.gflops, sm_clock_mhz=sm_clock,
    )


def _prior_wanted(session: Session, order: list[tuple[Problem, Any]]) -> Any:
    """``ranks_prior`` for the studies of ``order``: where the learned model will have measured
    configs of the family on another shape or GPU (an earlier shape's study of this command, a
    bundled recording of this GPU model, or the results database's) it never asks for the
    prior, whose compiles then need not be prepared. The database is asked (only for a sampler
    that needs it) for each family's newest runs: a family whose other units are all older is
    prepared anyway, as every study was before (the study just does not use it)."""

    def measured(family: Any, problem: Problem) -> Iterator[tuple[str, str, str]]:
        # lazy: ranks_prior looks only as far as it must
        here = order.index((problem, family))
        yield from ((session.gpu_name, f.name, p.shape) for p, f in order[:here] if f is family)
        if session.learn_from_recordings and session.training is None:
            yield from ((session.gpu_name, f, p.shape) for r in bundled(session.gpu_name)
                        for f, p in r.pairs() if f == family.name and p != problem)
        yield from ((run.gpu_name, run.family, run.problem.shape)
                    for run in session.database.list_runs(family=family.name) if run.n_trials)

    def wanted(family: Any, problem: Problem) -> bool:
        return ranks_prior(session.sampler, family, (session.gpu_name, family.name, problem.shape),
                           measured(family, problem))

    return wanted


def time_share(left_s: float, weights: list[float], index: int) -> float:
    """The index-th study's seconds out of the ``left_s`` left: its weight's part of the weights
    of the studies still to run (all weights 0: an equal part), at least MIN_STUDY_SECONDS. A
    study that ends early so leaves its time to the later ones in proportion to theirs."""
    rest = sum(weights[index:])
    part = weights[index] / rest if rest > 0 else 1.0 / (len(weights) - index)
    return max(MIN_STUDY_SECONDS, left_s * part)


def tune_all(
    session: Session,
    families: list[Any],
    problems: list[Problem],
    budget: Budget,
    *,
    total_seconds: float | None = None,
    weights: Mapping[Problem, float] | None = None,
) -> Summary:
    """Runs the studies shape by shape. With ``total_seconds`` each study's time budget is a
    share of what is left (``time_share``), by its problem's weight (a workload's share of GEMM
    time; default equal), so time a study does not need passes to the next ones."""
    summary = Summary()
    arch = session.evaluator.arch()
    offered = [f for f in families if f.offered_on(arch)]
    for family in families:
        if family not in offered:  # e.g. wgmma on an Ampere GPU: no study, no share of the time
            log.warning("%s skipped: it runs only on %s (%s); this GPU is %s", family.name,
                        ", ".join(family.architectures), family.architecture_reason, arch)
    families = offered
    started = time.monotonic()
    order = [(problem, family) for problem in problems for family in families]
    weight_of = [float(weights.get(problem, 0.0)) if weights else 1.0 for problem, _ in order]
    wanted = _prior_wanted(session, order) if session.prefetch_startup else None
    posts = AheadPosts(session, budget.trials)
    with StartupPrefetch(session) as prefetch:

        def plan_shape(problem: Problem) -> None:
            """The start-ups of ``problem``'s studies, planned at its start, once the shapes
            before have stored every trial: a fit prepared earlier is of fewer examples than its
            study reads, and the study fitted again on the main thread, the GPU idle
            (docs/measurement.md, "Start-ups planned shape by shape"). The first on a thread
            beside the shape's baseline, the others in the processes, in order."""
            if wanted is None:
                return
            prefetch.prepare_here(families[0], problem, wanted(families[0], problem))
            prefetch.plan(((family, problem) for family in families[1:]), wanted)

        def study(index: int, baseline: Baseline | None) -> StudyRun:
            """The index-th study of ``order``, its time share taken from what is left now; its
            warm start (and the later studies', AHEAD), then its first asks once its start-up is
            in hand, handed to the GPU first, which measures them while the study is built."""
            problem, family = order[index]
            posts.warm_starts([f for p, f in order[index:] if p == problem], problem)
            study_budget = budget
            if total_seconds is not None:
                left = total_seconds - (time.monotonic() - started)
                study_budget = dataclasses.replace(budget, timeout_s=time_share(left, weight_of, index))
            startup = prefetch.take(family, problem)
            posts.first_asks(family, problem, startup)
            return StudyRun(session, family, problem, study_budget,
                            None if baseline is None else baseline.gflops, startup,
                            place=f"{index + 1}/{len(order)}" if len(order) > 1 else "")

        index = 0
        while index < len(order) and not session.stop.requested:
            problem = order[index][0]
            plan_shape(problem)
            session.evaluator.set_problem(problem)
            baseline = _measure_baseline(session, problem)
            if baseline is not None:
                summary.baselines[problem] = baseline
            current: StudyRun | None = study(index, baseline)
            while current is not None:
                built: list[StudyRun] = []
                same_shape = index + 1 < len(order) and order[index + 1][0] == problem

                def build_next() -> None:
                    # the shape's next study is built while the GPU measures this one's last
                    # candidates (tf32x3's and pipelined's set-ups left it idle 0.3-1 s on the
                    # H100; docs/measurement.md, "Study boundaries")
                    if session.stop.requested:
                        return
                    try:
                        built.append(study(index + 1, baseline))
                    except Exception:  # noqa: BLE001  not this run's failure: built again below
                        log.debug("building the next study early failed", exc_info=True)

                def while_waiting() -> None:
                    posts.while_waiting([(f, prefetch.peek(f, problem))
                                         for p, f in order[index + 1:] if p == problem], problem)

                outcome = current.run(build_next if same_shape else None,
                                      while_waiting if same_shape else None)
                summary.outcomes.append((problem, current.family, outcome))
                index += 1
                if not same_shape or session.stop.requested:
                    current = None
                else:
                    current = built[0] if built else study(index, baseline)
            if session.retime_rounds and not session.stop.requested:
                summary.settle(session, problem)
    summary.interrupted = session.stop.requested
    return summary
