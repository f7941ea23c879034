"""The verl step runner: verl's own trainer (``verl.trainer.main_ppo``) on one config, for a
few real steps, read back from verl's own per-step metrics.

It runs in verl's own environment (verl pins a transformers the engines' environments do
not have), found like an engine's: ``AUTOTUNER_ENGINE_PYTHON__VERL`` and/or
``AUTOTUNER_ENGINE_PYTHONPATH__VERL``. ``launch`` (no verl import) starts
``python -m trials.verl`` there; ``runner``, ``overrides`` and ``agent_loop`` import verl
and run only there. Importing this package imports nothing of verl.
"""

from __future__ import annotations

# The environment's name in the per-engine settings (AUTOTUNER_ENGINE_PYTHON__VERL).
VERL = "verl"
