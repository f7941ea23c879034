"""The job spec: what to tune, on what hardware, within which budget.

Field names follow verl where verl has the concept (``train_batch_size``,
``ppo_mini_batch_size``, ``n``, ``max_prompt_length``), so a user can copy them from
a verl command. Every field has a default, bounds and a one-line description; the
cross-field rules live in validators whose messages quote the values and the fix.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import numpy as np
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from autotuner import catalog
from autotuner.errors import SpecError, UnknownModelError
from autotuner.model_config import config_problems
from autotuner.samplers import SAMPLERS
from autotuner.yamlload import load_spec_yaml
from trials.lengths import draw_lengths
from trials.rollout import BACKENDS  # the engines' names: no engine is imported


def _named_in(registry: Mapping[str, Any], what: str) -> Callable[[str], str]:
    """A check that ``name`` is a row of ``registry``; any other name is refused with a
    message that lists the valid ones."""

    def check(name: str) -> str:
        if name not in registry:
            raise ValueError(f"unknown {what} {name!r}; valid {what}s: {', '.join(sorted(registry))}")
        return name

    return check


# A name from a registry: validated against it, listed in the JSON schema as an enum.
EngineName = Annotated[  # trials.rollout.BACKENDS
    str,
    AfterValidator(_named_in(BACKENDS, "rollout engine")),
    Field(json_schema_extra={"enum": sorted(BACKENDS)}),
]
SamplerName = Annotated[  # autotuner.samplers.SAMPLERS
    str,
    AfterValidator(_named_in(SAMPLERS, "sampler")),
    Field(json_schema_extra={"enum": sorted(SAMPLERS)}),
]


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold true or false (itself or inside)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_takes_bool(arg) for arg in get_args(annotation))


class _Model(BaseModel):
    # No NaN or infinity in any number, however given (``"inf"``, ``1e999``): JSON stores
    # neither, so a spec holding one could not be read back.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_stray_bools(cls, data: Any) -> Any:
        """pydantic reads true as 1: refuse a boolean in a field that takes none (YAML reads
        yes, no, on and off as booleans), so that ``max_trials: yes`` does not mean 1."""
        from autotuner.domains import KnobValueError

        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if field is None or _takes_bool(field.annotation):
                continue
            if isinstance(value, bool) or (
                isinstance(value, list) and any(isinstance(v, bool) for v in value)
            ):
                what = (
                    f"{str(value).lower()} is a boolean" if isinstance(value, bool) else "it holds a boolean"
                )
                raise KnobValueError(
                    (name,),
                    f"{what}, and {name} takes none (YAML reads yes, no, on and off as booleans); "
                    "write the value itself",
                )
        return data


# --------------------------------------------------------------------------- lengths

# The longest length a distribution may name, in tokens: far beyond any model's context
# (lengths are cut to max_prompt_length / max_response_length, at most 1,048,576), and well
# inside the 64-bit integers that draws compute in.
MAX_LENGTH_TOKENS = 1_000_000_000
Tokens = Annotated[int, Field(ge=1, le=MAX_LENGTH_TOKENS)]


class _Lengths(_Model):
    def draw(self, count: int, rng: np.random.Generator, cap: int) -> list[int]:
        """Draw ``count`` lengths, clipped to [1, cap], as a trial draws them
        (``trials.lengths``)."""
        return draw_lengths(self.model_dump(), count, rng, cap)

    def quantiles(self, u: np.ndarray, cap: int) -> np.ndarray:
        """The lengths at probabilities ``u`` (a draw's quantile function), rounded and
        clipped to [1, cap] as a draw is: bounded work, whatever the batch size."""
        return np.clip(np.rint(np.asarray(self._quantiles(u), dtype=float)), 1, cap)

    def _quantiles(self, u: np.ndarray) -> Any:  # pragma: no cover
        raise NotImplementedError

    def upper_bound(self) -> float:
        """A length no draw exceeds (before the cap); inf when unbounded."""
        return math.inf

    def lower_bound(self) -> int:
        """A length no draw falls below."""
        return int(getattr(self, "min", 1))


def _normal_quantiles(u: np.ndarray) -> np.ndarray:
    unit = statistics.NormalDist()
    return np.array([unit.inv_cdf(float(p)) for p in u])


class FixedLengths(_Lengths):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_LENGTH_TOKENS, description="The length, in tokens.")

    def _quantiles(self, u: np.ndarray) -> Any:
        return np.full(len(u), self.value)

    def upper_bound(self) -> float:
        return self.value

    def lower_bound(self) -> int:
        return self.value


class UniformLengths(_Lengths):
    """Lengths uniform on [low, high]."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_LENGTH_TOKENS, description="Shortest length, in tokens.")
    high: int = Field(ge=1, le=MAX_LENGTH_TOKENS, description="Longest length, in tokens.")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLengths:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high}); swap them")
        return self

    def _quantiles(self, u: np.ndarray) -> Any:
        return np.minimum(self.low + np.floor(u * (self.high - self.low + 1)), self.high)

    def upper_bound(self) -> float:
        return self.high

    def lower_bound(self) -> int:
        return self.low


class NormalLengths(_Lengths):
    """Lengths ~ N(mean, std), clipped to [min, max]."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0, le=MAX_LENGTH_TOKENS, description="Mean length, in tokens.")
    std: float = Field(ge=0, le=MAX_LENGTH_TOKENS, description="Standard deviation, in tokens.")
    min: int = Field(
        default=1, ge=1, le=MAX_LENGTH_TOKENS, description="Lengths below this are raised to it."
    )
    max: int | None = Field(
        default=None, ge=1, le=MAX_LENGTH_TOKENS, description="Lengths above this are cut to it."
    )

    def _quantiles(self, u: np.ndarray) -> Any:
        raw = self.mean + self.std * _normal_quantiles(u)
        return np.clip(raw, self.min, self.max or np.inf)

    def upper_bound(self) -> float:
        return self.max if self.max is not None else math.inf


class LognormalLengths(_Lengths):
    """Long-tailed lengths: exp(N(log(median), sigma)), clipped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, le=MAX_LENGTH_TOKENS, description="Median length, in tokens.")
    sigma: float = Field(default=0.6, ge=0, le=5, description="Spread of log(length).")
    min: int = Field(
        default=1, ge=1, le=MAX_LENGTH_TOKENS, description="Lengths below this are raised to it."
    )
    max: int | None = Field(
        default=None, ge=1, le=MAX_LENGTH_TOKENS, description="Lengths above this are cut to it."
    )

    def _quantiles(self, u: np.ndarray) -> Any:
        raw = np.exp(math.log(self.median) + self.sigma * _normal_quantiles(u))
        return np.clip(raw, self.min, self.max or np.inf)

    def upper_bound(self) -> float:
        return self.max if self.max is not None else math.inf


# The most distinct lengths a ``list`` distribution keeps: a submitted list is stored as its
# distinct lengths and their counts, so that a dataset's measured lengths (any number of
# them) cost every read of the job, every trial spec and its page in proportion to these.
MAX_DISTINCT_LENGTHS = 65_536


class ListLengths(_Lengths):
    """Lengths resampled (with replacement) from an explicit list, e.g. from a real dataset.

    A submitted spec's list is kept as its distinct lengths, ascending, with ``counts``: how
    often each occurs. A draw is the same either way (``trials.lengths``)."""

    kind: Literal["list"] = "list"
    values: list[Tokens] = Field(
        min_length=1, max_length=1_000_000, description="Lengths, in tokens (repeats count)."
    )
    counts: list[Annotated[int, Field(ge=1, le=10**12)]] | None = Field(
        default=None,
        max_length=1_000_000,
        description="How often each of ``values`` occurs (default: once each).",
    )

    @model_validator(mode="after")
    def _distinct(self, info: ValidationInfo) -> ListLengths:
        counts = self.counts
        if counts is not None and len(counts) != len(self.values):
            raise ValueError(
                f"counts has {len(counts)} entries for {len(self.values)} values; give one count "
                "per value, or leave counts out to list each length as often as it occurs"
            )
        if _stored(info):  # a stored spec is read as it was stored: its draws stay the same
            return self
        distinct, inverse = np.unique(np.asarray(self.values, dtype=np.int64), return_inverse=True)
        if len(distinct) > MAX_DISTINCT_LENGTHS:
            raise ValueError(
                f"values holds {len(distinct):,} distinct lengths, more than the "
                f"{MAX_DISTINCT_LENGTHS:,} a distribution keeps; round them to a coarser grid "
                "(e.g. multiples of 8 tokens)"
            )
        if counts is None:
            merged = np.bincount(inverse, minlength=len(distinct))
        else:
            merged = np.zeros(len(distinct), dtype=np.int64)
            np.add.at(merged, inverse, np.asarray(counts, dtype=np.int64))
        if int(merged.sum()) > 2**53:
            raise ValueError("counts add up to more than 2**53; divide them by a common factor")
        object.__setattr__(self, "values", [int(v) for v in distinct])  # frozen: set once, here
        object.__setattr__(self, "counts", [int(c) for c in merged])
        return self

    def _quantiles(self, u: np.ndarray) -> Any:
        values = np.asarray(self.values)
        if self.counts is None:  # stored before lists were kept by their distinct lengths
            ordered = np.sort(values)
            return ordered[np.minimum((u * len(ordered)).astype(int), len(ordered) - 1)]
        ends = np.cumsum(np.asarray(self.counts, dtype=np.int64))  # values ascend (_distinct)
        at = np.minimum((u * ends[-1]).astype(np.int64), ends[-1] - 1)
        return values[np.searchsorted(ends, at, side="right")]

    def upper_bound(self) -> float:
        return max(self.values)

    def lower_bound(self) -> int:
        return min(self.values)


LengthDistribution = Annotated[
    FixedLengths | UniformLengths | NormalLengths | LognormalLengths | ListLengths,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- model


class ModelArch(_Model):
    """The facts about an architecture that the search space and memory model need."""

    name: str
    config: dict[str, Any]

    @property
    def num_attention_heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def num_key_value_heads(self) -> int:
        return int(self.config.get("num_key_value_heads") or self.num_attention_heads)

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden_size // self.num_attention_heads)

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_position_embeddings(self) -> int:
        return int(self.config.get("max_position_embeddings") or 2048)

    @property
    def num_parameters(self) -> int:
        """Parameter count of a dense decoder (embeddings, attention, gated MLP, norms)."""
        h, n_layers = self.hidden_size, self.num_layers
        q = self.num_attention_heads * self.head_dim
        kv = 2 * self.num_key_value_heads * self.head_dim
        mlp = 3 * h * int(self.config["intermediate_size"])
        per_layer = h * q + h * kv + q * h + mlp + 2 * h
        embed = self.vocab_size * h
        lm_head = 0 if self.config.get("tie_word_embeddings") else embed
        return per_layer * n_layers + embed + lm_head + h


def _reason(exc: BaseException) -> str:
    """Why a file could not be read, without its path (an OSError's message names it)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) if not isinstance(exc, OSError) else type(exc).__name__


# The largest config.json read: a model's (Hugging Face's, with a vocabulary's labels at most)
# is kilobytes; a path to anything larger (a weights file) is refused before it is read.
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def resolve_model(name_or_path: str, models_dir: Path | None = None) -> ModelArch:
    """A catalog name, or a path to a config.json (or a folder holding one)."""
    config = catalog.lookup(name_or_path)
    if config is not None:
        return ModelArch(name=name_or_path, config=config)
    try:
        path = Path(name_or_path).expanduser()
        if models_dir is not None and not path.is_absolute():
            path = models_dir / path
        if path.is_dir():
            path = path / "config.json"
        found = path.is_file()
    except (OSError, ValueError, RuntimeError) as exc:  # a name too long, a NUL byte, a loop
        raise UnknownModelError(
            "workload.model", f"cannot look up {name_or_path!r}: {_reason(exc)}"
        ) from None
    if not found:
        raise UnknownModelError(
            "workload.model",
            f"{name_or_path!r} is neither a built-in model ({', '.join(catalog.catalog_names())}) "
            "nor a path to an HF config.json; use one of those names or a path to a config.json",
        )
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise UnknownModelError(
                "workload.model",
                f"{name_or_path!r} is {size:,} bytes, more than a config.json holds "
                f"({MAX_CONFIG_BYTES:,} at most); give the model's config.json (or its folder), "
                "not a weights file",
            )
        config = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise UnknownModelError("workload.model", f"cannot read {name_or_path!r}: {_reason(exc)}") from None
    if not isinstance(config, dict):
        raise UnknownModelError(
            "workload.model", f"{name_or_path!r} holds a {type(config).__name__}, not a config.json mapping"
        )
    problems = config_problems(config)
    if problems:
        raise UnknownModelError("workload.model", f"{name_or_path!r}: {'; '.join(problems)}")
    return ModelArch(name=path.parent.name or str(path), config=config)


# --------------------------------------------------------------------------- workload


# Validation context of a spec read back from the database to be shown or exported (not
# run): the limits added since it was stored are not applied to it, so an old job stays
# readable; ``jobs.JobContext.spec_of`` (a job about to run) applies them all.
STORED = {"stored": True}


def _stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


def read_stored_spec(spec_json: str) -> JobSpec:
    """A stored job's spec, to show or export (see ``STORED``)."""
    return JobSpec.model_validate_json(spec_json, context=STORED)


# The most requests (prompts x samples) in one PPO step a job may measure: the study draws
# the step's lengths and plans its micro-batches request by request, so this bounds the work
# and memory of every trial's preparation (verl's largest example recipes use 16,384).
MAX_REQUESTS_PER_STEP = 262_144


class Workload(_Model):
    """The RL step being tuned: model, lengths and verl's batch sizes."""

    model: str = Field(
        default="tiny",
        min_length=1,
        max_length=4096,  # PATH_MAX: a longer path names no file
        description="A built-in model name (see `autotuner models`) or a path to an HF config.json.",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Parameter dtype of the rollout engine and the actor."
    )
    engine: EngineName = Field(default="vllm", description="Rollout engine (actor_rollout_ref.rollout.name).")
    prompt_length: LengthDistribution = Field(
        default_factory=lambda: FixedLengths(value=256),
        description="Distribution of prompt lengths, in tokens.",
    )
    response_length: LengthDistribution = Field(
        default_factory=lambda: FixedLengths(value=256),
        description="Distribution of response lengths, in tokens (generated with ignore_eos).",
    )
    max_prompt_length: int = Field(
        default=512, ge=1, le=1_048_576, description="data.max_prompt_length; longer prompts are cut."
    )
    max_response_length: int = Field(
        default=512, ge=1, le=1_048_576, description="data.max_response_length; longer responses are cut."
    )
    train_batch_size: int = Field(
        default=256, ge=1, le=1_000_000, description="data.train_batch_size: prompts per PPO step."
    )
    n: int = Field(default=1, ge=1, le=1024, description="actor_rollout_ref.rollout.n: samples per prompt.")
    ppo_mini_batch_size: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="actor_rollout_ref.actor.ppo_mini_batch_size: prompts per optimizer step.",
    )
    use_kl_loss: bool = Field(
        default=True, description="actor.use_kl_loss: whether the reference model's forward runs."
    )
    entropy_coeff: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="actor.entropy_coeff: weight of the entropy bonus; above 0 the update "
        "computes the logits' entropy with gradients (verl's default 0 computes none).",
    )
    phases: Literal["rollout", "train", "both"] = Field(
        default="both", description="Which phases each trial measures."
    )

    @model_validator(mode="after")
    def _batch_rules(self, info: ValidationInfo) -> Workload:
        requests = self.train_batch_size * self.n
        if requests > MAX_REQUESTS_PER_STEP and not _stored(info):
            raise ValueError(
                f"train_batch_size*n ({self.train_batch_size}*{self.n} = {requests}) exceeds the "
                f"limit of {MAX_REQUESTS_PER_STEP} requests per step a job measures "
                "(autotuner.spec.MAX_REQUESTS_PER_STEP); lower train_batch_size or n: throughput "
                "per GPU depends on each GPU's share of the step, so a smaller step with the same "
                "share per GPU (fewer GPUs) measures the same"
            )
        if self.ppo_mini_batch_size > self.train_batch_size:
            raise ValueError(
                f"ppo_mini_batch_size ({self.ppo_mini_batch_size}) must be <= train_batch_size "
                f"({self.train_batch_size}) (verl rule S4); lower ppo_mini_batch_size"
            )
        for which, dist, cap in (
            ("prompt_length", self.prompt_length, self.max_prompt_length),
            ("response_length", self.response_length, self.max_response_length),
        ):
            low = dist.lower_bound()
            if low > cap:
                raise ValueError(
                    f"{which} never fits: its shortest length ({low}) exceeds max_{which} ({cap}); "
                    f"raise max_{which} or shorten the distribution"
                )
        return self

    @property
    def max_sequence_length(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def measures_rollout(self) -> bool:
        return self.phases in ("rollout", "both")

    @property
    def measures_train(self) -> bool:
        return self.phases in ("train", "both")


class Cluster(_Model):
    """The hardware the tuned config will run on (trainer.n_gpus_per_node, trainer.nnodes)."""

    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto", description="Where trials run: cuda, cpu (tiny models only), or auto-detect."
    )
    n_gpus_per_node: int = Field(default=1, ge=1, le=64, description="trainer.n_gpus_per_node.")
    nnodes: int = Field(default=1, ge=1, le=1024, description="trainer.nnodes.")
    device_memory_gib: float | None = Field(
        default=None,
        ge=0.0625,  # 64 MiB: less holds no model and no engine
        le=4096,
        description="Memory of one device (GiB); on cuda the GPU's own when unset, on cpu a cap "
        "enforced on each trial (default 8).",
    )

    trial_scope: Literal["replica", "world"] = Field(
        default="replica",
        description="What one trial runs. replica: one rollout replica on TP GPUs, one actor rank "
        "per GPU, each rank's share of the world emulated (collectives not timed); trials of "
        "different configs run side by side. world: the whole world on n_gpus_per_node GPUs of "
        "one node, the actor sharded over a real process group (collectives timed) and every "
        "replica serving its share (needs nnodes 1).",
    )

    @property
    def world_size(self) -> int:
        return self.n_gpus_per_node * self.nnodes

    @model_validator(mode="after")
    def _scope_fits_a_node(self) -> Cluster:
        if self.trial_scope == "world" and self.nnodes > 1:
            raise ValueError(
                f"trial_scope 'world' runs the whole world in one trial on one node, but nnodes="
                f"{self.nnodes}; use trial_scope 'replica' for a multi-node world"
            )
        return self


# --------------------------------------------------------------------------- search


class KnobOverride(_Model):
    """How the search treats one knob: fix it, narrow it, restrict its choices, or drop it."""

    fixed: Any = Field(default=None, description="Use this value in every trial.")
    low: float | None = Field(default=None, description="Smallest value to try.")
    high: float | None = Field(default=None, description="Largest value to try.")
    choices: list[Any] | None = Field(
        default=None, min_length=1, max_length=256, description="Try only these values."
    )
    drop: bool = Field(default=False, description="Do not search it: verl's default is used.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # A bare scalar or list means "fixed" / "choices".
        if isinstance(value, list):
            return {"choices": value}
        if not isinstance(value, dict):
            return {"fixed": value}
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> KnobOverride:
        kinds = [
            self.fixed is not None,
            self.low is not None or self.high is not None,
            self.choices is not None,
            self.drop,
        ]
        if sum(kinds) != 1:
            raise ValueError("give exactly one of fixed, low/high, choices or drop")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


# Why a job on a CPU cannot verify in verl, and the fix (``JobSpec`` and the job's runner).
VERIFY_ON_CPU = (
    "{n} trials to verify in verl, but this job's trials run on cpu, where verl cannot run a "
    "training step; set budget.verify_in_verl to 0 (or leave it unset), or run the job on cuda"
)


class Budget(_Model):
    """How much measuring a job may do."""

    max_trials: int = Field(default=20, ge=1, le=10_000, description="Trials to run (measured ones).")
    max_minutes: float = Field(default=120.0, gt=0, le=7 * 24 * 60, description="Wall-clock cap.")
    max_concurrent_trials: int = Field(default=1, ge=1, le=256, description="Trials in flight at once.")
    trial_timeout_s: float = Field(
        default=900.0, ge=10, le=24 * 3600, description="A trial still running after this is killed."
    )
    patience_trials: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="Stop early once this many measured trials in a row have not improved the "
        "Pareto front by more than the tie band: noise_band_pct, or the noise measured on the "
        "baselines' repeats once that is larger (0: never stop early).",
    )
    noise_band_pct: float = Field(
        default=2.0,
        ge=0,
        le=50,
        description="Measurement noise (%): a trial within it of a front point is no improvement "
        "(early stopping), and finalists within it (or within the winner's measured spread, if "
        "larger) tie; of tied finalists the one with the least peak memory wins.",
    )
    remeasure_finalists: int | None = Field(
        default=None,
        ge=0,
        le=32,
        description="Pareto-front trials (fastest first) measured again at the end for a median "
        "and spread; default one per 8 max_trials, at most 3 (none below 8 trials); 0: none.",
    )
    remeasure_runs: int = Field(
        default=3, ge=2, le=20, description="Runs of each finalist in all, its first included."
    )
    baseline_runs: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Runs of each baseline in all, spread over the job: first, once half of "
        "max_trials is measured, then interleaved with the finalists at the end. Their spread "
        "is the job's measured noise, and sets the tie band (1: no noise is measured).",
    )
    compose_phases: bool = Field(
        default=True,
        description="Before asking the sampler, run the unmeasured config predicted fastest by "
        "adding the engine-side phase times of a measured trial with its rollout knobs to the "
        "train-side phase times of a measured trial with its train knobs, when the prediction "
        "beats the best measured throughput by more than noise_band_pct (autotuner.compose).",
    )
    reuse_rollouts: bool = Field(
        default=True,
        description="A one-GPU trial whose rollout knobs and actor offload equal those of a trial "
        "already measured (its engine saw the same) takes that rollout over instead of starting "
        "an engine: it only trains, with the sleeping engine's memory held. Finalists' "
        "re-measurements always run in full.",
    )

    verify_in_verl: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="After the search, the baselines and this many of the fastest Pareto-front "
        "trials run in verl itself (verl's main_ppo, interleaved and repeated) and the best "
        "verl-measured median wins; default 2 on CUDA when verl's environment is found "
        "(AUTOTUNER_ENGINE_PYTHON__VERL), else 0; 0: none. verl does not run on cpu.",
    )
    verify_rounds: int = Field(
        default=2, ge=1, le=10, description="Runs of each verified config in verl, interleaved A-B-C-A-B-C."
    )
    verify_steps: int = Field(
        default=4,
        ge=4,
        le=50,
        description="verl steps per verification run: the first is a warm-up, the rest are measured.",
    )
    verify_timeout_s: float = Field(
        default=1800.0, ge=60, le=24 * 3600, description="A verl run still running after this is killed."
    )

    @property
    def finalists(self) -> int:
        """How many Pareto-front trials are re-measured (``remeasure_finalists`` resolved)."""
        if self.remeasure_finalists is not None:
            return self.remeasure_finalists
        return min(3, self.max_trials // 8)


class MemoryModelSettings(_Model):
    """How the memory model (``autotuner.memory``) screens proposals before they run."""

    enabled: bool = Field(
        default=True,
        description="Predict each proposal's peak memory and skip the ones predicted not to fit "
        "(recorded as predicted_oom, infeasible for the sampler, never run).",
    )
    skip_margin: float = Field(
        default=0.15,
        ge=0,
        le=10,
        description="Skip only when a predicted peak exceeds the device's memory by more than this "
        "fraction (0.15: 15%), so a wrong model costs a trial, not the optimum.",
    )
    infer_from_neighbours: bool = Field(
        default=True,
        description="Skip a proposal that is at least as large as a measured OOM in every memory "
        "knob (gpu_memory_utilization, max_num_seqs, max_num_batched_tokens, micro-batch sizes, "
        "token budgets) and equal in the rest (recorded as inferred_oom).",
    )


ObjectiveMetric = Literal[
    "throughput_tokens_per_s_per_gpu",
    "peak_memory_gib",
    "rollout_generated_tokens_per_s",
    "step_time_s",
]
OBJECTIVE_DIRECTIONS: dict[str, Literal["maximize", "minimize"]] = {
    "throughput_tokens_per_s_per_gpu": "maximize",
    "peak_memory_gib": "minimize",
    "rollout_generated_tokens_per_s": "maximize",
    "step_time_s": "minimize",
}


class Objective(_Model):
    metric: ObjectiveMetric = Field(description="A trial metric.")
    direction: Literal["maximize", "minimize"] | None = Field(
        default=None, description="Defaults to the metric's natural direction."
    )

    @property
    def resolved_direction(self) -> Literal["maximize", "minimize"]:
        return self.direction or OBJECTIVE_DIRECTIONS[self.metric]


def _default_objectives() -> list[Objective]:
    return [Objective(metric="throughput_tokens_per_s_per_gpu"), Objective(metric="peak_memory_gib")]


class JobSpec(_Model):
    """A tuning job: the workload, the cluster, the search and the budget."""

    name: str = Field(
        default="job",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="A name for the job (letters, digits, . _ -).",
    )
    workload: Workload = Field(default_factory=Workload)
    cluster: Cluster = Field(default_factory=Cluster)
    search: dict[str, KnobOverride] = Field(
        default_factory=dict, description="Per-knob overrides, keyed by verl's Hydra path."
    )
    budget: Budget = Field(default_factory=Budget)
    memory_model: MemoryModelSettings = Field(default_factory=MemoryModelSettings)
    objectives: list[Objective] = Field(default_factory=_default_objectives, min_length=1, max_length=4)
    baselines: dict[Annotated[str, StringConstraints(min_length=1, max_length=128)], dict[str, Any]] = Field(
        default_factory=dict,
        max_length=16,
        description="Named configs (knob path -> value) measured first, besides verl's defaults, "
        "so the job reports its gain over them (e.g. your production command).",
    )
    sampler: SamplerName = Field(default="tpe", description="Optuna sampler that proposes configs.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for lengths and the sampler.")

    @model_validator(mode="after")
    def _cross_rules(self, info: ValidationInfo) -> JobSpec:
        from autotuner.baselines import RESERVED_BASELINES
        from autotuner.domains import KnobValueError, check_spec_values
        from autotuner.knobs import KNOBS  # the knob table depends on this module's types

        unknown = sorted(set(self.search) - set(KNOBS))
        if unknown:
            raise KnobValueError(
                ("search", unknown[0]),
                f"unknown knob(s) in search: {', '.join(unknown)}; valid knobs are: "
                + ", ".join(sorted(KNOBS)),
            )
        for name, config in self.baselines.items():
            if name in RESERVED_BASELINES and not _stored(info):
                raise KnobValueError(
                    ("baselines", name),
                    f"{name!r} is the name of a baseline every job runs (verl's defaults and "
                    "verl's example command for the model's size); give your baseline another name",
                )
            bad = sorted(set(config) - set(KNOBS))
            if bad:
                raise KnobValueError(
                    ("baselines", name, bad[0]),
                    f"baselines.{name} names unknown knob(s) {', '.join(bad)}; "
                    "use knob paths from the search space",
                )
        if not _stored(info):
            check_spec_values(self)
        metrics = [o.metric for o in self.objectives]
        if len(set(metrics)) != len(metrics):
            raise KnobValueError(
                ("objectives",), f"objectives repeat a metric ({metrics}); list each metric once"
            )
        w, c = self.workload, self.cluster
        if c.device == "cpu" and self.budget.verify_in_verl:
            raise KnobValueError(
                ("budget", "verify_in_verl"), VERIFY_ON_CPU.format(n=self.budget.verify_in_verl)
            )
        if (w.train_batch_size * w.n) % c.world_size:
            raise KnobValueError(
                ("workload", "train_batch_size"),
                f"train_batch_size*n ({w.train_batch_size}*{w.n}) must be divisible by the number of "
                f"GPUs ({c.world_size}) (verl rule S1); change train_batch_size or n",
            )
        if (w.ppo_mini_batch_size * w.n) % c.world_size:
            raise KnobValueError(
                ("workload", "ppo_mini_batch_size"),
                f"ppo_mini_batch_size*n ({w.ppo_mini_batch_size}*{w.n}) must be divisible by the "
                f"number of GPUs ({c.world_size}) (verl rule R7); change ppo_mini_batch_size",
            )
        return self

    def validate_model(self, models_dir: Path | None = None) -> ModelArch:
        """Resolve the model now, raising UnknownModelError with the fix."""
        arch = resolve_model(self.workload.model, models_dir)
        if self.workload.max_sequence_length > arch.max_position_embeddings:
            raise SpecError(
                "workload.max_response_length",
                f"max_prompt_length+max_response_length ({self.workload.max_sequence_length}) exceeds "
                f"the model's max_position_embeddings ({arch.max_position_embeddings}) (verl rule R4); "
                "shorten them",
            )
        return arch


def error_loc(err: Any) -> list[str | int]:
    """Where a pydantic error item points, validator frames left out; a cross-field rule
    that names its own place (``domains.KnobValueError.loc``) points there."""
    loc = [p for p in err["loc"] if not str(p).startswith("function-")]
    cause = (err.get("ctx") or {}).get("error")
    return [*loc, *getattr(cause, "loc", ())]


def error_msg(err: Any) -> str:
    """A pydantic error item's message, with the fix where pydantic's own lacks one."""
    if err["type"] == "int_parsing_size":  # e.g. 1e308 where a count is due
        return "a number too large for this whole-number field; give one within its bounds"
    return str(err["msg"]).removeprefix("Value error, ")


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error_loc(err))
        lines.append(f"{loc or '(job)'}: {error_msg(err)}")
    return "; ".join(lines)


def parse_job_spec(data: Any) -> JobSpec:
    """Validate a parsed document, raising SpecError that names the field and the fix."""
    if not isinstance(data, dict):
        raise SpecError("(job)", f"a job spec is a mapping, got {type(data).__name__}")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in error_loc(first)) or "(job)"
        raise SpecError(field, _format_validation_error(exc)) from None
    spec.validate_model()
    return spec


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a YAML or JSON job spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError("(file)", f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = load_spec_yaml(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise SpecError("(file)", f"{path} is not valid YAML/JSON: {exc}") from exc
    return parse_job_spec(data)
