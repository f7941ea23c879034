"""The Optuna internals autotuner still needs, in one place (checked against Optuna 5.0).

Optuna's public API writes a user attribute only through a live ``optuna.Trial``
(``Trial.set_user_attr``), which ``study.ask()`` hands out for a new or enqueued trial. A
trial that a dead process left RUNNING comes back from ``study.get_trials()`` as a
``FrozenTrial``, and no public call turns it into a live ``Trial`` again: its attributes are
written here through the study's storage (``Study._storage``) by the storage's own id of the
trial (``FrozenTrial._trial_id``).

Everything else goes through the public API: ``study.tell`` returns the trial as told
(``FrozenTrial``), which is what the study loop records.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial


def set_user_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """``Trial.set_user_attr`` for a trial known only as a ``FrozenTrial`` (one still RUNNING
    in the storage, say)."""
    study._storage.set_trial_user_attr(trial._trial_id, key, value)
