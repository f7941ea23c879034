"""Errors a user can cause, each saying what to change."""

from __future__ import annotations


class AutotunerError(Exception):
    """Root of every error autotuner raises on purpose."""


class SpecError(AutotunerError):
    """Raised when a job spec is invalid: names the field, the value, the rule and the fix."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class UnknownModelError(SpecError):
    """Raised when a model is neither in the built-in catalog nor a readable config.json."""


class UnknownBackendError(AutotunerError):
    """Raised when a registry (sampler, rollout engine) is asked for a name it does not have."""


class InfeasibleSpaceError(AutotunerError):
    """Raised when no configuration satisfies verl's rules for the workload and overrides."""


class JobBusyError(AutotunerError):
    """Raised when a job cannot be taken over: another live process runs it, or it finished."""


class ExportError(AutotunerError):
    """Raised when a config cannot be exported: it names a key the exporter does not know."""


class RayUnavailableError(AutotunerError):
    """Raised when the Ray cluster named by AUTOTUNER_RAY_ADDRESS cannot be joined."""


class EngineUnavailableError(AutotunerError):
    """Raised when a job's trials cannot run its rollout engine: the trials' Python does not
    find the engine's package (the message names the settings that point the trials at an
    environment that has it), or the engine does not run on the job's device."""
