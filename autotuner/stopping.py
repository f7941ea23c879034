"""Early stopping: a job stops once its Pareto front has stopped improving beyond the noise.

A measured trial *improves* the front when no earlier feasible trial covers it: q covers p
when q is at least as good as p on every objective of the job up to the noise band
(``q >= p * (1 - band)`` for a maximized objective, ``q <= p * (1 + band)`` for a
minimized one). Infeasible and failed trials never improve it. A job whose front is
still empty never stops early (there is nothing to improve on yet). The band is the job's
tie band (``autotuner.noise``): ``budget.noise_band_pct`` until a baseline has run twice,
then the noise measured on the baselines' repeats where that is larger, so a gain inside the
measured noise does not keep a job searching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autotuner.records import TrialRecord
from autotuner.spec import Objective


def _covers(q: TrialRecord, p: TrialRecord, objectives: Sequence[Objective], band: float) -> bool:
    for o in objectives:
        qv, pv = q.metric(o.metric), p.metric(o.metric)
        if qv is None or pv is None:
            return False
        if o.resolved_direction == "maximize":
            if qv < pv * (1.0 - band):
                return False
        elif qv > pv * (1.0 + band):
            return False
    return True


def improves(
    new: TrialRecord, earlier: Sequence[TrialRecord], objectives: Sequence[Objective], band: float
) -> bool:
    """Whether ``new`` (feasible) is covered by none of the ``earlier`` feasible trials."""
    if not new.feasible or any(new.metric(o.metric) is None for o in objectives):
        return False
    return not any(_covers(q, new, objectives, band) for q in earlier)


@dataclass
class Patience:
    """Counts the measured trials since the front last improved beyond ``band``."""

    objectives: Sequence[Objective]
    band: float
    patience: int
    # Where ``band`` comes from: the floor the budget assumes until a baseline has run twice,
    # then the noise measured on the baselines' repeats where that is larger.
    band_source: str = "assumed: budget.noise_band_pct"
    feasible: list[TrialRecord] = field(default_factory=list)
    since_improvement: int = 0

    def add(self, record: TrialRecord) -> None:
        """Account for one measured trial (in the order they finished)."""
        if improves(record, self.feasible, self.objectives, self.band):
            self.since_improvement = 0
        else:
            self.since_improvement += 1
        if record.feasible:
            self.feasible.append(record)

    @property
    def exhausted(self) -> bool:
        return bool(self.patience and self.feasible and self.since_improvement >= self.patience)

    def reason(self) -> str:
        return (
            f"stopped early: the Pareto front has not improved beyond the "
            f"{100 * self.band:.3g}% noise band ({self.band_source}) in the last "
            f"{self.since_improvement} measured "
            f"trials (budget.patience_trials = {self.patience})"
        )
