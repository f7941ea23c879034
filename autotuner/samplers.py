"""Sampler strategies, chosen by name from one registry (lazy, so a name costs nothing:
the job spec checks its ``sampler`` against ``SAMPLERS`` without importing Optuna)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from autotuner.errors import UnknownBackendError

if TYPE_CHECKING:
    import optuna


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    import optuna

    # multivariate: the knobs interact (gmu x max_num_seqs, micro-batch x checkpointing).
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5)


def _nsga2(seed: int) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)


def _random(seed: int) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": _tpe,
    "nsga2": _nsga2,
    "random": _random,
}


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    try:
        factory = SAMPLERS[name]
    except KeyError:
        raise UnknownBackendError(
            f"unknown sampler {name!r}; valid samplers are: {', '.join(sorted(SAMPLERS))}"
        ) from None
    return factory(seed)
