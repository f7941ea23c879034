"""Export one trial's config as verl keys: a nested YAML fragment or Hydra override lines.

``verl_config`` is the single place that decides which keys are written: the tuned knobs,
plus the keys the workload fixes and verl v0.9.0 needs to accept the config unchanged, and
``actor.strategy: fsdp2`` where the actor's ``param_offload`` was measured under FSDP2
(docs/verl-rules.md, section 2). ``to_yaml`` and ``to_overrides`` only
format that dict. The output is a partial config: model path, data files and algorithm
stay the user's, so it is merged into their verl config or passed as overrides.

An SGLang job's config follows verl's rules for SGLang: ``rollout.name: sglang``, no
``max_num_batched_tokens`` (verl does not pass it; a config that has one says so in its
header), the chunk size as ``rollout.engine_kwargs.sglang.chunked_prefill_size`` (Hydra:
``+``, a key absent from verl's YAML), ``gpu_memory_utilization`` and ``max_num_seqs``
under verl's names (verl maps them to ``mem_fraction_static`` and
``max_running_requests``).
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

import yaml

from autotuner.domains import config_refusals
from autotuner.errors import ExportError
from autotuner.knobs import KNOBS, A, R
from autotuner.spec import JobSpec

REF = "actor_rollout_ref.ref."

# Keys the workload and the cluster fix; none of them needs Hydra's "+".
WORKLOAD_KEYS: frozenset[str] = frozenset(
    {
        "data.train_batch_size",
        "data.max_prompt_length",
        "data.max_response_length",
        R + "n",
        R + "name",
        R + "max_model_len",
        A + "ppo_mini_batch_size",
        A + "use_kl_loss",
        A + "entropy_coeff",
        "trainer.n_gpus_per_node",
        "trainer.nnodes",
    }
)
# The ref's token budget is not a knob: it copies the log-prob forward's budget.
REF_TOKEN_KEY = REF + "log_prob_max_token_len_per_gpu"
# Not a knob either: the FSDP a config with the actor's param_offload was measured under.
STRATEGY_KEY = A + "strategy"
_PARAM_OFFLOAD = A + "fsdp_config.param_offload"
# Every key the exporter can ever emit.
VERL_KEYS: frozenset[str] = frozenset(KNOBS) | WORKLOAD_KEYS | {REF_TOKEN_KEY, STRATEGY_KEY}

_MAX_NUM_SEQS = R + "max_num_seqs"
_MAX_NUM_SEQS_V090 = 256  # verl v0.9.0's YAML default (its dataclass says 1024)
_USAGE = [
    "Usage: a partial verl v0.9.0 config (model path, data files and algorithm stay yours).",
    "Merge these keys into your verl config, or use the overrides file:",
    "  python -m verl.trainer.main_ppo $(grep -v '^#' OVERRIDES_FILE) <your other overrides>",
]


# --------------------------------------------------------------------------- what to emit


def verl_config(config: dict[str, Any], spec: JobSpec) -> dict[str, Any]:
    """The flat verl keys for one trial: its tuned knobs plus what the workload fixes.

    ``config`` is a trial's flat config (knob paths and the derived max_model_len);
    a key the exporter does not know raises ExportError.
    """
    unknown = sorted(set(config) - set(KNOBS) - {R + "max_model_len"})
    if unknown:
        raise ExportError(
            f"cannot export unknown key(s) {', '.join(unknown)}; a trial config holds only "
            f"knobs ({', '.join(sorted(KNOBS))}) and {R}max_model_len"
        )
    refused = config_refusals(config)
    if refused:
        raise ExportError(
            f"refusing to export a config verl would reject: {'; '.join(refused)} (a job stored "
            "before knob values were checked at submission); export another trial"
        )
    w, c = spec.workload, spec.cluster
    dynamic = bool(config.get(A + "use_dynamic_bsz", False))
    # Only the knobs that apply (``Knob.applies``): the batching keys of the chosen mode, the
    # ref's only when the ref runs, the update's entropy only when it has one.
    out = {k: v for k, v in config.items() if k in KNOBS and KNOBS[k].applies(w, config)}
    if dynamic and w.use_kl_loss and R + "log_prob_max_token_len_per_gpu" in out:
        out[REF_TOKEN_KEY] = out[R + "log_prob_max_token_len_per_gpu"]
    # verl v0.9.0 drops a False here and vLLM keeps chunked prefill on; never pretend otherwise.
    if out.get(R + "enable_chunked_prefill") is False:
        del out[R + "enable_chunked_prefill"]
    for key in _not_for_engine(out, w.engine):  # e.g. max_num_batched_tokens for SGLang
        del out[key]
    # Its default flipped 1024 <-> 256 across verl releases: always say which one was measured.
    out.setdefault(_MAX_NUM_SEQS, _MAX_NUM_SEQS_V090)
    # A trial offloads the actor's parameters under FSDP2 only (``trialspec.actor_strategy``),
    # whose weight sync streams them from the CPU tensor by tensor. Under verl's default FSDP1
    # the sync loads the whole shard onto the GPU and offloads it again every step
    # (``get_per_tensor_param``), which no trial measured: run what was measured. The ref
    # follows (``ref.strategy: ${actor_rollout_ref.actor.strategy}`` in verl's YAML).
    if out.get(_PARAM_OFFLOAD) is True:
        out[STRATEGY_KEY] = "fsdp2"
    out.update(
        {
            "data.train_batch_size": w.train_batch_size,
            "data.max_prompt_length": w.max_prompt_length,
            "data.max_response_length": w.max_response_length,
            R + "n": w.n,
            R + "name": w.engine,
            R + "max_model_len": w.max_sequence_length,
            A + "ppo_mini_batch_size": w.ppo_mini_batch_size,
            A + "use_kl_loss": w.use_kl_loss,
            A + "entropy_coeff": w.entropy_coeff,
            "trainer.n_gpus_per_node": c.n_gpus_per_node,
            "trainer.nnodes": c.nnodes,
        }
    )
    return out


def _not_for_engine(config: dict[str, Any], engine: str) -> list[str]:
    """The knobs of ``config`` that verl does not pass to ``engine`` (a config measured
    before the engine had its own counterpart)."""
    return sorted(k for k in config if k in KNOBS and engine not in KNOBS[k].engines)


def hydra_plus(key: str) -> bool:
    """Whether a key is absent from verl's YAML, so that Hydra needs ``+key=value``."""
    return key in KNOBS and KNOBS[key].hydra_plus


# --------------------------------------------------------------------------- header


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _figure(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return format(value, ".6g")
    return _one_line(value)


def _header_lines(config: dict[str, Any], spec: JobSpec, header: dict[str, Any]) -> list[str]:
    """The comment block: job, trial, measured figures, device, date, usage."""
    w, c = spec.workload, spec.cluster
    date = header.get("date") or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    lines = [
        f"verl config exported by autotuner: job {_one_line(header.get('job', spec.name))}, "
        f"trial {_one_line(header.get('trial', '?'))}",
        f"workload: model {w.model}, engine {w.engine}, {c.nnodes} node(s) x {c.n_gpus_per_node} GPU(s)",
        f"measured on: {_one_line(header.get('device', 'unknown device'))}, {_one_line(date)}",
    ]
    metrics = header.get("metrics") or {}
    if metrics:
        lines.append("measured:")
        lines += [f"  {_one_line(name)}: {_figure(v)}" for name, v in sorted(metrics.items())]
    extra = sorted(set(header) - {"job", "trial", "device", "date", "metrics"})
    lines += [f"{_one_line(k)}: {_one_line(header[k])}" for k in extra]
    for key in _not_for_engine(config, w.engine):
        counterpart = [
            k.path
            for k in KNOBS.values()
            if w.engine in k.engines and k.trial_field == KNOBS[key].trial_field
        ]
        lines.append(f"not emitted: {key}={_one_line(config[key])}: verl does not pass it to {w.engine}")
        if counterpart:
            lines.append(f"  ({w.engine}'s counterpart is {counterpart[0]}).")
    if config.get(_PARAM_OFFLOAD) is True:
        lines.append(
            f"{STRATEGY_KEY}: fsdp2, the FSDP this config's param_offload was measured under "
            "(verl's default fsdp, FSDP1, loads the whole parameter shard onto the GPU for "
            "every weight sync)"
        )
    lines += _USAGE
    return lines


def _comment(lines: list[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


# --------------------------------------------------------------------------- YAML


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(flat):
        *parents, leaf = path.split(".")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ExportError(f"{path}: a parent of it is itself a key; export one of them")
        if leaf in node:
            raise ExportError(f"{path}: it is also the parent of other keys; export one of them")
        node[leaf] = flat[path]
    return root


def to_yaml(config: dict[str, Any], spec: JobSpec, header: dict[str, Any]) -> str:
    """A nested verl YAML fragment with a comment header; keys sorted."""
    body = yaml.safe_dump(_nest(verl_config(config, spec)), sort_keys=True, default_flow_style=False)
    return _comment(_header_lines(config, spec, header)) + body


def _flatten(node: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, path + ".", out)
        else:
            out[path] = value


def load_exported_yaml(text: str) -> dict[str, Any]:
    """Read an exported YAML back into a flat dict keyed by verl paths (comments ignored)."""
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ExportError(f"an exported config is a mapping, got {type(data).__name__}")
    out: dict[str, Any] = {}
    _flatten(data, "", out)
    return out


# --------------------------------------------------------------------------- Hydra overrides

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_HYDRA_WORDS = {"true", "false", "null", "none", "inf", "nan"}


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it: True/False, null, [1,2,4], 'quoted'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, str):
        if _BARE.fullmatch(value) and value.lower() not in _HYDRA_WORDS:
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise ExportError(f"cannot write {value!r} ({type(value).__name__}) as a Hydra value")


def to_overrides(config: dict[str, Any], spec: JobSpec, header: dict[str, Any]) -> str:
    """Hydra override lines ``key=value`` (``+key=value`` for keys verl's YAML lacks)."""
    flat = verl_config(config, spec)
    lines = [f"{'+' if hydra_plus(k) else ''}{k}={hydra_value(flat[k])}" for k in sorted(flat)]
    return _comment(_header_lines(config, spec, header)) + "".join(f"{ln}\n" for ln in lines)
