"""The search space of one job: which knobs are searched, over which values, and the rest fixed.

Built from the knob table, the workload, the cluster and the user's overrides. Every
proposal is a flat config keyed by verl paths; one that breaks a verl or engine rule
(``autotuner.rules``) is reported as such and never run.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from pydantic import TypeAdapter, ValidationError

from autotuner.errors import InfeasibleSpaceError, SpecError
from autotuner.knobs import KNOBS, Knob, R, SpaceContext
from autotuner.rules import Violation, violations
from autotuner.spec import JobSpec, KnobOverride, ModelArch

KNOB_TYPES: dict[str, Any] = {"float": float, "int": int, "bool": bool}


@dataclass(frozen=True)
class Proposal:
    """A config the sampler proposed, and the rules it breaks (empty: it may run)."""

    config: dict[str, Any]
    violations: list[Violation] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.violations


@dataclass
class SearchSpace:
    """Searched knobs with their candidate values, and fixed values for the others."""

    spec: JobSpec
    arch: ModelArch
    device: Literal["cuda", "cpu"]
    searched: dict[str, list[Any]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def context(self) -> SpaceContext:
        return SpaceContext(self.spec.workload, self.spec.cluster, self.arch, self.device)

    # ----------------------------------------------------------------- building

    @classmethod
    def build(cls, spec: JobSpec, arch: ModelArch, device: Literal["cuda", "cpu"]) -> SearchSpace:
        space = cls(spec, arch, device)
        ctx = space.context
        measured = {"rollout": spec.workload.measures_rollout, "train": spec.workload.measures_train}
        space._check_engine_knobs()
        for path, knob in KNOBS.items():
            override = spec.search.get(path)
            if override is not None and override.fixed is not None:
                space.fixed[path] = space._coerce(knob, override.fixed, "fixed")
                continue
            opted_out = override.drop if override is not None else not knob.searched_by_default
            if opted_out or not measured[knob.phase]:
                space.fixed[path] = space._baseline(knob)
                continue
            values = space._candidates(knob, ctx, override)
            if len(values) == 1:
                space.fixed[path] = values[0]
            else:
                space.searched[path] = values
        space._drop_inapplicable()
        space._check_fixed()
        return space

    def _check_engine_knobs(self) -> None:
        """A knob verl does not pass to the job's engine cannot be searched or fixed for it."""
        engine = self.spec.workload.engine
        for path in self.spec.search:
            knob = KNOBS[path]
            if engine not in knob.engines:
                instead = [
                    k.path
                    for k in KNOBS.values()
                    if engine in k.engines and k.trial_field == knob.trial_field
                ]
                hint = f"; its counterpart for {engine} is {instead[0]}" if instead else ""
                raise SpecError(
                    f"search.{path}",
                    f"verl does not pass this knob to {engine} (only to {', '.join(knob.engines)}){hint}",
                )

    def _drop_inapplicable(self) -> None:
        """A searched knob that applies under no choice of the searched switches (e.g. the ref
        micro-batch without use_kl_loss, token budgets with use_dynamic_bsz fixed off) is
        not searched; it never reaches a config."""
        ctx = self.context
        switches = [p for p, v in self.searched.items() if KNOBS[p].kind == "bool"]
        variants = [dict(self.fixed)]
        for path in switches:
            variants = [v | {path: b} for v in variants for b in (False, True)]
        for path in list(self.searched):
            if not any(KNOBS[path].relevant(ctx, v) for v in variants):
                self.fixed[path] = self.searched.pop(path)[0]

    def _coerce(self, knob: Knob, value: Any, what: str) -> Any:
        try:
            return TypeAdapter(KNOB_TYPES[knob.kind]).validate_python(value, strict=knob.kind == "bool")
        except ValidationError:
            raise SpecError(
                f"search.{knob.path}.{what}",
                f"{value!r} is not a {knob.kind}; give a {knob.kind} value",
            ) from None

    def _valid_alone(self, knob: Knob, value: Any) -> list[Violation]:
        """Rules broken by ``value`` for this knob, with every other knob at its baseline."""
        config = self.baseline_config()
        config[knob.path] = value
        return [
            v
            for v in violations(config, self.spec.workload, self.spec.cluster, self.arch)
            if v.key == knob.path
        ]

    def _candidates(self, knob: Knob, ctx: SpaceContext, override: KnobOverride | None) -> list[Any]:
        values = knob.candidates(ctx)
        where = f"search.{knob.path}"
        if override is not None and override.choices is not None:
            values = [self._coerce(knob, v, "choices") for v in override.choices]
            broken = [(v, self._valid_alone(knob, v)) for v in values]
            bad = [f"{v!r} ({errs[0].message})" for v, errs in broken if errs]
            if bad:
                raise SpecError(
                    where + ".choices",
                    "invalid for this workload: "
                    + "; ".join(bad)
                    + f"; valid values include {knob.candidates(ctx)}",
                )
            return sorted(set(values), key=values.index)
        if override is not None and (override.low is not None or override.high is not None):
            low = override.low if override.low is not None else float("-inf")
            high = override.high if override.high is not None else float("inf")
            if knob.kind == "bool":
                raise SpecError(where, "a bool knob has no range; use fixed or choices")
            inside = [v for v in values if low <= v <= high]
            if not inside and knob.kind == "float":
                inside = sorted({v for v in (low, high) if 0 < v <= 1})
            if not inside:
                raise SpecError(where, f"no valid value in [{low}, {high}]; valid values are {values}")
            values = inside
        return values

    def _baseline(self, knob: Knob) -> Any:
        """verl's default for the knob, or the nearest value verl would accept."""
        if not self._valid_alone(knob, knob.baseline):
            return knob.baseline
        options = [v for v in knob.candidates(self.context) if not self._valid_alone(knob, v)]
        if not options:
            raise InfeasibleSpaceError(f"{knob.path}: no value satisfies verl's rules here")
        return min(options, key=lambda v: (abs(float(v) - float(knob.baseline)), -float(v)))

    def _check_fixed(self) -> None:
        config = self.baseline_config() | self.fixed
        broken = [
            v
            for v in violations(config, self.spec.workload, self.spec.cluster, self.arch)
            if v.key in self.fixed and v.key in self.spec.search
        ]
        if broken:
            v = broken[0]
            raise SpecError(
                f"search.{v.key}.fixed",
                f"{v.message} (verl rule {v.rule}); "
                f"pick a value from {KNOBS[v.key].candidates(self.context)}",
            )

    # ----------------------------------------------------------------- configs

    def derived(self) -> dict[str, Any]:
        """Keys set from the workload, not searched."""
        return {R + "max_model_len": self.spec.workload.max_sequence_length}

    def baseline_config(self) -> dict[str, Any]:
        """verl v0.9.0's defaults, repaired where verl itself would reject them."""
        config: dict[str, Any] = {}
        for path, knob in KNOBS.items():
            config[path] = knob.baseline
        # Repair the baseline's own rule breaks (e.g. TP 2 on one GPU, micro 4 not dividing).
        for _ in range(2):
            broken = violations(config, self.spec.workload, self.spec.cluster, self.arch)
            for v in broken:
                if v.key in KNOBS:
                    ctx = self.context
                    options = [
                        c
                        for c in KNOBS[v.key].candidates(ctx)
                        if not [
                            x
                            for x in violations(
                                config | {v.key: c}, self.spec.workload, self.spec.cluster, self.arch
                            )
                            if x.key == v.key
                        ]
                    ]
                    if options:
                        base = float(KNOBS[v.key].baseline)
                        config[v.key] = min(options, key=lambda c: (abs(float(c) - base), -float(c)))
        return self._prune(config) | self.derived()

    def _prune(self, config: dict[str, Any]) -> dict[str, Any]:
        """Drop knobs that do not apply to this config (micro-batches under dynamic bsz, ...)."""
        ctx = self.context
        return {p: v for p, v in config.items() if p not in KNOBS or KNOBS[p].relevant(ctx, config)}

    def completed(self, config: dict[str, Any]) -> dict[str, Any]:
        """A config named outside the study (a baseline, a trial's recorded config) in full:
        verl's defaults, the job's fixed knobs, then its own values; knobs that do not apply
        to it or to the job's engine dropped, as a proposal's are. A knob that applies only
        under a switch the config turns (dynamic batching's token budgets) gets verl's
        default."""
        defaults = {path: knob.baseline for path, knob in KNOBS.items()} | self.baseline_config()
        return self._prune(defaults | self.fixed | config) | self.derived()

    def full_config(self, params: dict[str, Any]) -> dict[str, Any]:
        """Fixed values, then the sampled params, then derived keys; inapplicable knobs dropped."""
        return self._prune(self.fixed | params) | self.derived()

    def chosen(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` hold every knob ``suggest`` asks for them: a proposal cut off
        before its last knob was drawn (its database went away meanwhile) chose no config."""
        ctx = self.context
        partial: dict[str, Any] = dict(self.fixed)
        for path in self.searched:
            if not KNOBS[path].relevant(ctx, partial):
                continue
            if path not in params:
                return False
            partial[path] = params[path]
        return True

    def suggest(self, trial: optuna.Trial) -> Proposal:
        """Sample a config define-by-run; conditional knobs are only asked when they apply."""
        ctx = self.context
        partial: dict[str, Any] = dict(self.fixed)
        for path, values in self.searched.items():
            knob = KNOBS[path]
            if not knob.relevant(ctx, partial):
                continue
            partial[path] = trial.suggest_categorical(path, values)
        config = self.full_config({p: partial[p] for p in self.searched if p in partial})
        return Proposal(config, violations(config, self.spec.workload, self.spec.cluster, self.arch))

    def describe(self) -> list[dict[str, Any]]:
        """One row per knob: how it is treated, for the CLI and the API."""
        rows = []
        engine = self.spec.workload.engine
        for path in KNOBS:
            if engine not in KNOBS[path].engines:
                continue
            if path in self.searched:
                rows.append({"knob": path, "searched": True, "values": self.searched[path]})
            else:
                rows.append({"knob": path, "searched": False, "values": [self.fixed[path]]})
        return rows

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct config the search can propose that verl would accept, in the order
        of the product of the searched values (inapplicable knobs dropped, as ``suggest``
        drops them): what a grid search runs, and what a landscape recorder measures."""
        out: dict[str, dict[str, Any]] = {}
        paths = list(self.searched)
        for values in itertools.product(*(self.searched[p] for p in paths)):
            config = self.full_config(dict(zip(paths, values, strict=True)))
            key = json.dumps(config, sort_keys=True, default=str)
            if key in out or violations(config, self.spec.workload, self.spec.cluster, self.arch):
                continue
            out[key] = config
        return list(out.values())

    @property
    def size(self) -> int:
        """Number of points in the (unconditioned) grid."""
        total = 1
        for values in self.searched.values():
            total *= len(values)
        return total
