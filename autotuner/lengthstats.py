"""Summary statistics of a job's step lengths, computed from its distributions.

The memory model needs the shape of a rank's largest micro-batch, not the lengths of its
requests: the trial draws those in its own process (``trials.lengths``), and the service
works from the distributions alone, in bounded work whatever the batch size. Each of the
prompt and response distributions is represented by ~570 weighted quantiles (rounded and
capped as a draw is; finer towards the ends); a sequence's length (prompt + response) by
their pairwise sums, sorted once per job. From those come the expected longest of ``count``
sequences (the quantile at Blom's plotting position ``(count - 0.375) / (count + 0.25)``)
and the largest of ``groups`` sums of ``k`` consecutive sequences: the quantile of such a
sum at that position, by the saddlepoint approximation (Lugannani-Rice) of its tail from
the distributions' cumulant generating functions. It holds for long-tailed lengths, where
a normal approximation misses the one long response that makes a micro-batch the
largest; the ``n`` samples of one prompt share its length.

A rank's sequences come in the order verl's trainer hands them over
(``trials.lengths.verl_batch_order``): the shorter half of the responses first, shortest
first, then the longer half in no order of length. ``VerlOrder`` gives a run of that order
its statistics: the heaviest runs lie in the second half, sums of sequences whose responses
come from the distribution's upper half and whose prompts are independent.
``PromptOrder`` is the same for sequences in the prompts' order.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from autotuner.spec import Workload


def _grid() -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and their weights: 509 equal bins over the bulk, and bins halving
    towards either end down to 2**-40, so that the longest of a million draws is seen."""
    lower = 0.5 ** np.arange(40, 9, -1)  # 2**-40 .. 2**-10
    bulk = np.linspace(2.0**-9, 1 - 2.0**-9, 509)
    edges = np.concatenate([[0.0], lower, bulk, 1 - lower[::-1], [1.0]])
    return (edges[1:] + edges[:-1]) / 2, np.diff(edges)


def blom(count: int) -> float:
    """The probability at which the largest of ``count`` draws sits, on average."""
    return (count - 0.375) / (count + 0.25)


@dataclass(frozen=True)
class StepLengths:
    """A job's lengths, as weighted quantile samples: the prompts', the responses' and the
    sequences' (every prompt with every response, sorted, with cumulative weights)."""

    prompts: np.ndarray
    responses: np.ndarray
    weights: np.ndarray  # of each prompt (and each response) sample
    sequences: np.ndarray  # sorted
    cumulative: np.ndarray  # the sequences' cumulative weights
    samples_per_prompt: int

    @classmethod
    def of(cls, w: Workload, longer_half: bool = False) -> StepLengths:
        """The job's lengths; ``longer_half``: those of the sequences whose responses lie in
        the distribution's upper half, each with a prompt of its own."""
        u, weights = _grid()
        prompts = w.prompt_length.quantiles(u, w.max_prompt_length)
        responses = w.response_length.quantiles(0.5 + u / 2 if longer_half else u, w.max_response_length)
        sums = (prompts[:, None] + responses[None, :]).ravel()
        order = np.argsort(sums, kind="stable")
        pair_weights = (weights[:, None] * weights[None, :]).ravel()[order]
        n = 1 if longer_half else w.n
        return cls(prompts, responses, weights, sums[order], np.cumsum(pair_weights), n)

    @property
    def mean(self) -> float:
        return float((self.prompts * self.weights).sum() + (self.responses * self.weights).sum())

    def quantile(self, p: float) -> float:
        index = int(np.searchsorted(self.cumulative, p * self.cumulative[-1]))
        return float(self.sequences[min(index, len(self.sequences) - 1)])

    def longest(self, count: int) -> float:
        """The expected longest of ``count`` sequences."""
        return self.quantile(blom(max(count, 1)))

    def shortest(self, count: int) -> float:
        """The expected shortest of ``count`` sequences."""
        return self.quantile(1.0 - blom(max(count, 1)))

    def largest_sum(self, k: int, groups: int) -> float:
        """The expected largest total of ``groups`` runs of ``k`` consecutive sequences."""
        if k <= 1:
            return self.longest(groups)
        target = 1.0 - blom(groups)  # the tail probability of the largest run
        high = k * float(self.sequences[-1])
        if groups <= 1:
            return k * self.mean
        cgf = _SumCgf(self.prompts, self.responses, self.weights, k, self.samples_per_prompt)
        spread = math.sqrt(max(cgf.moments(0.0)[2], 1.0))
        t_low, t_high = 0.0, 1.0 / spread
        for _ in range(200):  # grow the bracket until the tail is below the target
            if cgf.tail(t_high) <= target or cgf.mean(t_high) >= high * (1 - 1e-9):
                break
            t_low, t_high = t_high, 2 * t_high
        for _ in range(60):
            mid = 0.5 * (t_low + t_high)
            if cgf.tail(mid) > target:
                t_low = mid
            else:
                t_high = mid
        return min(high, max(k * self.mean, cgf.mean(t_high)))


@dataclass(frozen=True)
class PromptOrder:
    """A rank's sequences in the prompts' order (``BatchDraw.train_order`` "prompts")."""

    whole: StepLengths

    @classmethod
    def of(cls, w: Workload) -> PromptOrder:
        return cls(StepLengths.of(w))

    def largest_run(self, k: int, runs: int) -> float:
        """The expected largest total of ``runs`` runs of ``k`` consecutive sequences."""
        return self.whole.largest_sum(k, runs)

    def shortest_in_largest_run(self, k: int, runs: int) -> float:
        """The expected shortest sequence of that run."""
        return self.whole.shortest(k)


@dataclass(frozen=True)
class VerlOrder:
    """A rank's sequences in verl's order: ``whole``, the step's statistics; ``longer``,
    those of its second half (see the module's notes)."""

    whole: StepLengths
    longer: StepLengths

    @classmethod
    def of(cls, w: Workload) -> VerlOrder:
        return cls(StepLengths.of(w), StepLengths.of(w, longer_half=True))

    def largest_run(self, k: int, runs: int) -> float:
        """The expected largest total of ``runs`` runs of ``k`` consecutive sequences: one
        run is the whole; else the heaviest of the second half's ``runs // 2``."""
        if runs <= 1:
            return k * self.whole.mean
        if k <= 1:
            return self.whole.longest(runs)
        return self.longer.largest_sum(k, max(1, runs // 2))

    def shortest_in_largest_run(self, k: int, runs: int) -> float:
        """The expected shortest sequence of that run."""
        return (self.whole if runs <= 1 else self.longer).shortest(k)


def _tilted(values: np.ndarray, weights: np.ndarray, t: float) -> tuple[float, float, float]:
    """Cumulant generating function of a weighted sample at ``t``, and its first two
    derivatives (the tilted mean and variance)."""
    tx = t * values
    top = float(tx.max())
    tilted = weights * np.exp(tx - top)
    total = float(tilted.sum())
    mean = float((tilted * values).sum()) / total
    var = float((tilted * (values - mean) ** 2).sum()) / total
    return top + math.log(total / float(weights.sum())), mean, var


class _SumCgf:
    """The sum of ``k`` consecutive sequences: ``k / j`` samples of each of ``j`` prompts
    (``j = ceil(k / n)``), and ``k`` responses."""

    def __init__(
        self, prompts: np.ndarray, responses: np.ndarray, weights: np.ndarray, k: int, n: int
    ) -> None:
        self.prompts, self.responses, self.weights, self.k = prompts, responses, weights, k
        self.j = max(1, math.ceil(k / max(n, 1)))
        self.c = k / self.j

    def moments(self, t: float) -> tuple[float, float, float]:
        kp, mp, vp = _tilted(self.prompts, self.weights, self.c * t)
        kr, mr, vr = _tilted(self.responses, self.weights, t)
        cgf = self.j * kp + self.k * kr
        return cgf, self.j * self.c * mp + self.k * mr, self.j * self.c**2 * vp + self.k * vr

    def mean(self, t: float) -> float:
        """The total at which ``t`` is the saddlepoint."""
        return self.moments(t)[1]

    def tail(self, t: float) -> float:
        """P(sum > x) at the saddlepoint ``t`` of ``x`` (Lugannani-Rice)."""
        cgf, x, var = self.moments(t)
        unit = statistics.NormalDist()
        if t <= 0 or var <= 0:
            return 0.5
        w = math.sqrt(max(2.0 * (t * x - cgf), 0.0))
        u = t * math.sqrt(var)
        if w < 1e-6:
            return 0.5
        return max(0.0, 1.0 - unit.cdf(w) + unit.pdf(w) * (1.0 / u - 1.0 / w))
