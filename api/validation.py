"""Validation of job files with problems a newcomer can act on.

Every problem names the field path (camelCase, as written in YAML), what is wrong and what would
be right; all problems of a document are reported together.
"""

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from asyncrl.api.cel import RuleError
from asyncrl.api.job import API_VERSION, KIND, AsyncRLJob


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a job document: ``path`` like ``spec.correction.mask.bounds``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A job document failed validation; ``problems`` lists every problem found."""

    def __init__(self, problems: list[SpecProblem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        lines = "\n".join(f"  {where}{p}" for p in problems)
        super().__init__(f"invalid AsyncRLJob ({len(problems)} problem(s)):\n{lines}")


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the object at ``loc`` (aliases), for 'did you mean' hints."""
    model: type[BaseModel] = AsyncRLJob
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list field: the field's model already is the item's
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        sub = _as_model(field.annotation)
        if sub is None:
            return None
        model = sub
    return model


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None:
        for arg in get_args(annotation):
            found = _as_model(arg)
            if found is not None:
                return found
    return None


def _path(loc: tuple[Any, ...]) -> str:
    """``spec.rollout.template.env[0].name``: dotted fields, list items in brackets (as kubectl writes)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _describe(err: dict[str, Any]) -> tuple[str, str]:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    path = _path(loc)
    kind, got = err["type"], err.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        valid = _field_names(parent) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return path, f"unknown field; {hint}valid fields here: {', '.join(valid)}"
    if kind == "missing":
        return path, "required field is missing; add it"
    if kind == "enum":
        expected = err.get("ctx", {}).get("expected", "")
        return path, f"got {got!r}; expected one of {expected}"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return path, f"got {got!r}; expected one of {expected}"
    if kind == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        options = pattern.strip("^$()").replace("|", ", ") if "|" in pattern else pattern
        return path, f"got {got!r}; expected one of {options}"
    msg = err["msg"].removeprefix("Value error, ")
    if got is not None and not isinstance(got, dict | list) and "got" not in msg and repr(got) not in msg:
        msg = f"{msg} (got {got!r})"
    return path, msg


def _described(err: dict[str, Any]) -> list[tuple[str, str]]:
    """One ``(path, message)``, or several when a model check raised :class:`RuleError`."""
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, RuleError):
        base, _ = _describe(err)
        base = "" if base == "(document)" else base
        return [(".".join(p for p in (base, sub) if p) or "(document)", msg) for sub, msg in cause.problems]
    return [_describe(err)]


def problems_from(exc: ValidationError) -> list[SpecProblem]:
    """Turn a pydantic error into one :class:`SpecProblem` per failing field."""
    seen: dict[tuple[str, str], None] = {}
    for err in exc.errors():
        for problem in _described(dict(err)):
            seen.setdefault(problem, None)
    # A union field (e.g. an optional number) can report each branch; keep the first one per path.
    out: list[SpecProblem] = []
    paths: set[str] = set()
    for path, msg in seen:
        if path in paths:
            continue
        paths.add(path)
        out.append(SpecProblem(path, msg))
    return out


def quickstart_doc() -> dict[str, Any]:
    """The embedded default job (``asyncrl run`` with no file; ``examples/quickstart.yaml``) as a plain
    document, not yet validated."""
    import importlib.resources

    return dict(yaml.safe_load(importlib.resources.files("asyncrl.api").joinpath("examples/quickstart.yaml").read_text()))


def validate_job(doc: Any, source: str = "") -> AsyncRLJob:
    """Validate one parsed YAML document; raise :class:`SpecError` listing every problem."""
    if not isinstance(doc, dict):
        raise SpecError([SpecProblem("(document)", "expected a mapping with apiVersion, kind, metadata, spec")], source)
    if doc.get("kind") not in (None, KIND) or doc.get("apiVersion") not in (None, API_VERSION):
        raise SpecError(
            [
                SpecProblem(
                    "kind",
                    f"got apiVersion={doc.get('apiVersion')!r} kind={doc.get('kind')!r}; "
                    f"expected apiVersion: {API_VERSION} and kind: {KIND}",
                )
            ],
            source,
        )
    try:
        return AsyncRLJob.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(problems_from(exc), source) from None


def load_jobs(path: str | Path) -> list[AsyncRLJob]:
    """Parse and validate every AsyncRLJob document of a YAML file (other kinds are skipped)."""
    text = Path(path).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError([SpecProblem("(file)", f"not valid YAML: {exc}")], str(path)) from None
    jobs = [validate_job(d, str(path)) for d in docs if not isinstance(d, dict) or d.get("kind", KIND) == KIND]
    if not jobs:
        raise SpecError([SpecProblem("(file)", f"no {KIND} document found")], str(path))
    return jobs
