"""A posted job: body -> document -> JobSpec, refusing anything that could not run.

Checked at submission, so that a bad job never reaches the queue: the body parses (JSON,
or YAML by Content-Type), the spec validates, the budget is within the service's caps, a
model given as a path lies inside ``AUTOTUNER_MODELS_DIR``, and the search space builds
(unknown knobs, impossible ranges, values verl would reject).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autotuner import catalog
from autotuner.api.errors import InvalidInputError, UnsupportedMediaTypeError, spec_error_loc
from autotuner.errors import InfeasibleSpaceError, SpecError
from autotuner.jobs import build_space, check_capacity, engine_device_problem, resolve_device
from autotuner.settings import Settings
from autotuner.spec import JobSpec
from autotuner.verification import check_verification
from autotuner.yamlload import DuplicateKeyError, load_spec_json, load_spec_yaml

log = logging.getLogger(__name__)

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
# A YAML document can alias one node many times; walking it must stay bounded. A spec holds
# at most a few measured length lists (``ListLengths``: up to 1,000,000 values each).
MAX_NODES = 2_500_000


def parse_body(body: bytes, content_type: str | None) -> Any:
    """The document in a request body: JSON by default, YAML when the type says so."""
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES + YAML_TYPES:
        raise UnsupportedMediaTypeError(
            f"Content-Type {media!r} is not accepted; send the job spec as application/json "
            "or application/yaml",
            field="Content-Type",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError.at(["body"], f"the body is not UTF-8 text: {exc}") from None
    if not text.strip():
        raise InvalidInputError.at(["body"], "the body is empty; send a job spec", "missing")
    try:
        if media in JSON_TYPES:
            return load_spec_json(text)
        return load_spec_yaml(text)
    except (json.JSONDecodeError, DuplicateKeyError) as exc:
        raise InvalidInputError.at(["body"], f"invalid JSON: {exc}", "json_invalid") from None
    except yaml.YAMLError as exc:
        raise InvalidInputError.at(["body"], f"invalid YAML: {exc}", "yaml_invalid") from None
    except RecursionError:
        raise InvalidInputError.at(["body"], "the document is nested too deeply") from None
    except ValueError as exc:  # an integer literal past Python's digit limit
        raise InvalidInputError.at(["body"], f"a literal the service cannot read: {exc}") from None


# Where a node lies, as a chain of (parent, key) links: built in constant time per node, and
# spelled out as a path only when an error names it.
_Where = tuple[Any, str | int] | None


def _loc(where: _Where) -> list[str | int]:
    keys: list[str | int] = []
    while where is not None:
        where, key = where
        keys.append(key)
    return ["body", *reversed(keys)]


def _check_document(document: Any) -> None:
    """Refuse documents too big to walk, a YAML node that contains itself (an alias to its
    own anchor), non-finite numbers (NaN, inf), and text that is not Unicode (a JSON escape
    of half a surrogate pair), which no database column stores.

    A node that aliases share is checked once and then counted by its size, so the work is
    linear in the document as written, however far its aliases would expand."""
    count = 0
    sizes: dict[int, int] = {}  # a container checked already: the values it expands to
    on_path: set[int] = set()  # the containers from the root down to the node walked
    # (where, node, count on entry): a container is met on the way down (None) and up.
    stack: list[tuple[_Where, Any, int | None]] = [(None, document, None)]
    while stack:
        where, node, entered = stack.pop()
        if entered is not None:
            on_path.discard(id(node))
            sizes[id(node)] = count - entered
            continue
        container = isinstance(node, dict | list) and not (isinstance(node, list) and _plain_ints(node))
        if container and id(node) in on_path:
            raise InvalidInputError.at(
                _loc(where),
                "this node contains itself (a YAML alias to its own anchor); a job spec is a tree: "
                "write the values out",
            )
        count += sizes.get(id(node), 1 + (len(node) if isinstance(node, list) and not container else 0))
        if count > MAX_NODES:
            raise InvalidInputError.at(
                ["body"], f"the document has more than {MAX_NODES} values; a job spec is far smaller"
            )
        if isinstance(node, float) and not math.isfinite(node):
            raise InvalidInputError.at(_loc(where), f"{node} is not a finite number", "finite_number")
        if isinstance(node, str):
            _check_text(where, node)
            if "\x00" in node:
                raise InvalidInputError.at(_loc(where), "the text holds a NUL character; leave it out")
        if not container or id(node) in sizes:
            continue
        on_path.add(id(node))
        stack.append((where, node, count - 1))
        if isinstance(node, dict):
            for key in node:
                _check_text((where, _printable(str(key))), key)
                if isinstance(key, str) and "\x00" in key:
                    raise InvalidInputError.at(
                        _loc(where), f"the key {_printable(key)!r} holds a NUL character"
                    )
            stack.extend(((where, str(k)), v, None) for k, v in node.items())
        else:
            stack.extend(((where, i), v, None) for i, v in enumerate(node))


def _plain_ints(values: list[Any]) -> bool:
    """A list of integers only (a measured length list): counted at C speed, not walked."""
    return all(type(v) is int for v in values)


def _check_text(where: _Where, text: Any) -> None:
    if isinstance(text, str) and not _encodable(text):
        raise InvalidInputError.at(
            _loc(where), "the text holds a lone surrogate escape (\\ud800-\\udfff); send Unicode"
        )


def _printable(text: str) -> str:
    """``text`` as an error may quote it: a lone surrogate as its escape."""
    return text if _encodable(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Why a path does not resolve, where the exception carries no OS message.
_WHY: dict[type[Exception], str] = {
    RuntimeError: "a symbolic link loop",
    ValueError: "the path holds a NUL character",
}


def _within_models_dir(spec: JobSpec, models_dir: Path | None) -> JobSpec:
    """A model path must resolve (symlinks too) inside ``models_dir``; stored absolute.
    Messages name the path as the client gave it, never where it lies on the server."""
    model = spec.workload.model
    if catalog.lookup(model) is not None:
        return spec
    loc: list[str | int] = ["body", "workload", "model"]
    if models_dir is None:
        raise InvalidInputError.at(
            loc,
            (
                f"{model!r} is not a built-in model ({', '.join(catalog.catalog_names())}); a path "
                "to a config.json is accepted over HTTP only inside the service's models "
                "directory: set AUTOTUNER_MODELS_DIR on the service"
            ),
        )
    try:
        root = models_dir.expanduser().resolve()
        path = (root / model).resolve()  # "~" is a plain name here: no home folder is looked up
        inside = path.is_relative_to(root)
        found = inside and (path.is_file() or (path / "config.json").is_file())
    except (OSError, RuntimeError, ValueError) as exc:  # too long, a NUL byte, a symlink loop
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else _WHY.get(type(exc), str(exc))
        raise InvalidInputError.at(loc, f"cannot resolve {model!r}: {why}") from None
    if not inside:
        raise InvalidInputError.at(
            loc,
            (
                f"{model!r} resolves outside the models directory (AUTOTUNER_MODELS_DIR); "
                "give a path inside it"
            ),
        )
    if not found:
        raise InvalidInputError.at(
            loc,
            (
                f"{model!r} is neither a built-in model ({', '.join(catalog.catalog_names())}) nor "
                "a config.json (or a folder holding one) in the models directory (AUTOTUNER_MODELS_DIR)"
            ),
        )
    workload = spec.workload.model_copy(update={"model": str(path)})
    return spec.model_copy(update={"workload": workload})


def _within_caps(spec: JobSpec, settings: Settings) -> None:
    budget = spec.budget
    if budget.max_trials > settings.max_job_trials:
        raise InvalidInputError.at(
            ["body", "budget", "max_trials"],
            (
                f"max_trials ({budget.max_trials}) exceeds this service's cap "
                f"({settings.max_job_trials}, AUTOTUNER_MAX_JOB_TRIALS); lower it"
            ),
        )
    if budget.max_minutes > settings.max_job_minutes:
        raise InvalidInputError.at(
            ["body", "budget", "max_minutes"],
            (
                f"max_minutes ({budget.max_minutes:g}) exceeds this service's cap "
                f"({settings.max_job_minutes:g}, AUTOTUNER_MAX_JOB_MINUTES); lower it"
            ),
        )


def validate_job(document: Any, settings: Settings) -> JobSpec:
    """A runnable JobSpec from a posted document, or InvalidInputError naming the field."""
    if not isinstance(document, dict):
        raise InvalidInputError.at(
            ["body"], (f"a job spec is a mapping (JSON object), got {type(document).__name__}"), "dict_type"
        )
    _check_document(document)
    try:
        spec = JobSpec.model_validate(document)
    except ValidationError as exc:
        raise InvalidInputError.from_validation(exc, ["body"]) from None
    _within_caps(spec, settings)
    given = spec.workload.model
    spec = _within_models_dir(spec, settings.models_dir)
    search_keys = list(spec.search)
    try:
        device = resolve_device(spec)
        wrong_device = engine_device_problem(spec, device)
        if wrong_device is not None:
            raise SpecError("workload.engine", wrong_device)
        check_verification(spec, device)
        space = build_space(spec, device, settings)
        check_capacity(spec, space, settings)
    except SpecError as exc:
        # The model was looked up at its place on the server: name it as the client did.
        message = exc.message.replace(spec.workload.model, given)
        raise InvalidInputError.at(spec_error_loc(exc, search_keys), message) from None
    except InfeasibleSpaceError as exc:
        raise InvalidInputError.at(["body", "search"], str(exc)) from None
    except (ValueError, TypeError, ArithmeticError) as exc:
        # A value the space builder did not foresee: still the input's fault, not ours.
        log.warning("search space of a submitted job failed to build: %r", exc)
        raise InvalidInputError.at(["body", "search"], f"cannot build the search space: {exc}") from None
    return spec
