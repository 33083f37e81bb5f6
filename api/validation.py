"""Validation of job files with problems a newcomer can act on.

Every problem names the field path (camelCase, as written in YAML), what is wrong and what would
be right; all problems of a document are reported together.
"""

import difflib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from asyncrl.api.cel import RuleError
from asyncrl.api.constants import GROUP
from asyncrl.api.job import API_VERSION, KIND, AsyncRLJob
from asyncrl.api.jobfile import Documents, parse_documents, read_documents


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a job document: ``path`` like ``spec.correction.mask.bounds``.

    ``document`` (1-based) and ``name`` (its metadata.name) say which document of a file with several.
    """

    path: str
    message: str
    document: int | None = None
    name: str | None = None

    def __str__(self) -> str:
        parts = [f"document {self.document}" + (f" ({self.name})" if self.name else "")] if self.document else []
        if self.path != "(file)":  # a problem of the whole file: the caller's prefix names it
            parts.append(self.path)
        return ": ".join([*parts, self.message])


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
        part = part if isinstance(part, int) or str(part).isprintable() else repr(part)  # one line, always
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


# Strict scalars (asyncrl.api.base): the type errors, in YAML's words, with the fix.
_TYPES = {
    "int_type": ("an integer", "write a whole number without quotes or a decimal point, e.g. 3"),
    "float_type": ("a number", "write a number without quotes, e.g. 0.5"),
    "bool_type": ("true or false", "write true or false without quotes (not yes/no, 1/0 or 'true')"),
    "string_type": ("a string", "quote the value, e.g. '8'"),
}
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null",
               dict: "a mapping", list: "a list"}


def _as_yaml(value: Any) -> str:
    """``value`` as YAML spells it (true, null, .inf), for messages about what the file says."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)


def _input_loc(loc: tuple[Any, ...], doc: Any) -> tuple[Any, ...]:
    """``loc`` without pydantic's own steps (a union member ``int``, a validator ``function-after[...]``):
    only the keys and indexes the document has, walked in it (a key may itself hold '[': ``kind[``)."""
    out = []
    node = doc
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and ("[" in part or part.startswith("function-")):
            continue  # a step of pydantic's, not of the document
        else:
            node = _GONE  # past the document (a missing field, a union member's name): keep, stop walking
        out.append(part)
    return tuple(out)


_GONE = object()


def _describe(err: dict[str, Any], doc: Any = None) -> tuple[str, str]:
    loc = _input_loc(tuple(err["loc"]), doc)
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
    if kind in _TYPES:
        expected, fix = _TYPES[kind]
        return path, f"expected {expected}, got {_as_yaml(got)} ({_TYPE_NAMES.get(type(got), type(got).__name__)}); {fix}"
    if kind == "finite_number":
        return path, f"expected a finite number, got {_as_yaml(got)}; .inf and .nan are not allowed: give a number"
    msg = err["msg"].removeprefix("Value error, ")
    if got is not None and not isinstance(got, dict | list) and "got" not in msg and repr(got) not in msg:
        msg = f"{msg} (got {got!r})"
    return path, msg


def _described(err: dict[str, Any], doc: Any) -> list[tuple[str, str]]:
    """One ``(path, message)``, or several when a model check raised :class:`RuleError`."""
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, RuleError):
        base, _ = _describe(err, doc)
        base = "" if base == "(document)" else base
        return [(".".join(p for p in (base, sub) if p) or "(document)", msg) for sub, msg in cause.problems]
    return [_describe(err, doc)]


def problems_from(exc: ValidationError, doc: Any = None) -> list[SpecProblem]:
    """Turn a pydantic error on the document ``doc`` into one :class:`SpecProblem` per failing field."""
    seen: dict[tuple[str, str], None] = {}
    for err in exc.errors():
        for problem in _described(dict(err), doc):
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

    text = importlib.resources.files("asyncrl.api").joinpath("examples/quickstart.yaml").read_text()
    read = parse_documents(text, "quickstart.yaml")
    if read.problems or len(read.documents) != 1:  # a packaging fault, not a user's
        raise RuntimeError(f"the embedded quickstart.yaml is broken: {read.problems}")
    return dict(read.documents[0][1])


def _close(got: Any, valid: str, cutoff: float = 0.75) -> bool:
    """Whether ``got`` looks like a misspelling of ``valid`` (any case, a letter or two off)."""
    if not isinstance(got, str):
        return False
    return got.lower() == valid.lower() or bool(difflib.get_close_matches(got, [valid], n=1, cutoff=cutoff))


def _header_problems(doc: dict[str, Any]) -> list[SpecProblem]:
    """apiVersion and kind, each with a "did you mean" when it is a near miss."""
    problems = []
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    expected = f"expected apiVersion: {API_VERSION} and kind: {KIND}"
    if kind is not None and kind != KIND:
        hint = f"did you mean {KIND}? (kinds are case-sensitive); " if _close(kind, KIND) else ""
        problems.append(SpecProblem("kind", f"got {kind!r}; {hint}{expected}"))
    if api_version is not None and api_version != API_VERSION:
        hint = f"did you mean {API_VERSION}?; " if _close(api_version, API_VERSION, 0.6) else ""
        problems.append(SpecProblem("apiVersion", f"got {api_version!r}; {hint}{expected}"))
    return problems


def _meant_as_job(doc: Any) -> bool:
    """Whether a document of a file is (meant to be) an AsyncRLJob: other kinds (a Namespace, a Secret next
    to the job) are skipped; a near-miss kind or our API group is a job with a typo."""
    if not isinstance(doc, dict):
        return True
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind is None or kind == KIND or _close(kind, KIND):
        return True
    return isinstance(api_version, str) and (api_version.split("/")[0] == GROUP or _close(api_version, API_VERSION))


def validate_job(doc: Any, source: str = "") -> AsyncRLJob:
    """Validate one parsed YAML document; raise :class:`SpecError` listing every problem."""
    if not isinstance(doc, dict):
        got = type(doc).__name__
        raise SpecError([SpecProblem("(document)", f"got a {got}; expected a mapping with apiVersion, kind, "
                                     "metadata and spec")], source)
    header = _header_problems(doc)
    if header:  # and the rest of the document's problems, as if the header were right
        doc = {**doc, "apiVersion": API_VERSION, "kind": KIND}
    try:
        job = AsyncRLJob.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(header + problems_from(exc, doc), source) from None
    if header:
        raise SpecError(header, source)
    return job


@dataclass
class JobFile:
    """Every AsyncRLJob of a file, and every problem of every document (all at once)."""

    source: str
    jobs: list[AsyncRLJob] = field(default_factory=list)
    problems: list[SpecProblem] = field(default_factory=list)


def _name_of(doc: Any) -> str | None:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def _jobs_of(read: Documents) -> JobFile:
    several = read.count > 1
    out = JobFile(read.source)
    out.problems = [SpecProblem(p.path, p.message, p.document if several else None) for p in read.problems]
    kinds: list[str] = []
    for index, doc in read.documents:
        if not _meant_as_job(doc):
            kinds.append(f"{doc.get('kind')!r} (document {index})")
            continue
        try:
            job = validate_job(doc, read.source)
            if index not in read.duplicated:  # (its duplicate keys are among the problems already)
                out.jobs.append(job)
        except SpecError as exc:
            name = _name_of(doc)
            out.problems.extend(replace(p, document=index if several else None, name=name if several else None)
                                for p in exc.problems)
    out.problems.sort(key=lambda p: p.document or 0)  # document by document, as in the file (stable)
    if not out.jobs and not out.problems:
        found = f"found only {', '.join(kinds)}" if kinds else "the file is empty"
        out.problems.append(SpecProblem("(file)", f"no {KIND} document found ({found}); a job file holds "
                                        f"documents with apiVersion: {API_VERSION} and kind: {KIND}"))
    return out


def read_job_file(path: str | Path) -> JobFile:
    """Read and validate every AsyncRLJob document of a YAML file (other kinds are skipped), safely
    (:mod:`asyncrl.api.jobfile`); never raises for what the file holds."""
    return _jobs_of(read_documents(path))


def load_jobs(path: str | Path) -> list[AsyncRLJob]:
    """The AsyncRLJobs of a file; :class:`SpecError` with every problem of every document if any."""
    read = read_job_file(path)
    if read.problems:
        raise SpecError(read.problems, str(path))
    return read.jobs
