"""Job files that are not what they claim: every problem one line naming the file, the document, what is
wrong and the fix; all documents, all files; never a traceback (``asyncrl.api.jobfile``).

The reader runs in-process for most cases; ``asyncrl validate`` / ``run`` / ``driver`` run as
subprocesses for a few (exit codes, no traceback, later files still read, Ray never imported).
"""

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import yaml

from asyncrl.api.jobfile import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, parse_documents, read_documents
from asyncrl.api.validation import SpecError, load_jobs, read_job_file

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
HEAD = "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\n"

# 9 levels of 9 aliases: 9^9 = 387 million "lol" once expanded, in well under 1 KiB (the issue's 700 bytes).
_LEVELS = [", ".join([f"*{chr(96 + i)}" if i else '"lol"'] * 9) for i in range(9)]
BILLION_LAUGHS = HEAD + "metadata: {name: bomb}\nspec:\n  rollout:\n    template:\n      affinity:\n" + "".join(
    f"        {chr(97 + i)}: &{chr(97 + i)} [{items}]\n" for i, items in enumerate(_LEVELS)
)


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _lines(path: Path) -> list[str]:
    return [f"{path}: {p}" for p in read_job_file(path).problems]


# ------------------------------------------------------------------------------------------ YAML bombs


def test_billion_laughs_is_refused_after_the_node_budget_with_little_memory(tmp_path: Path) -> None:
    assert len(BILLION_LAUGHS.encode()) < 1024
    path = _write(tmp_path, "bomb.yaml", BILLION_LAUGHS)
    tracemalloc.start()
    try:
        (line,) = _lines(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a few thousand nodes are composed, never the 387 million: peak memory stays tiny (it was 3.2 GB)
    assert peak < 8 * 2**20, peak
    assert line.startswith(f"{path}: spec.rollout.template.affinity.")
    assert f"more than {MAX_NODES} YAML nodes" in line and "aliases count as many nodes as what they name" in line


def test_a_recursive_alias_is_refused() -> None:
    read = parse_documents(HEAD + "metadata: {name: loop}\nspec:\n  rollout: &r {template: {affinity: [*r]}}\n", "f")
    (problem,) = read.problems
    assert "alias *r at line 5 is used inside its own anchor &r" in problem.message
    assert read.documents == []


def test_aliases_within_the_budget_still_work() -> None:
    text = HEAD + "metadata: {name: ok}\nspec:\n  rollout: {resources: &res {cpu: '2', memory: 4Gi}}\n" \
                  "  actor: {resources: *res}\n"
    (job,) = load_jobs_from_text(text)
    assert job.spec.actor.resources == job.spec.rollout.resources


def load_jobs_from_text(text: str) -> list:
    from asyncrl.api.validation import _jobs_of

    read = _jobs_of(parse_documents(text, "t.yaml"))
    assert read.problems == []
    return read.jobs


# ---------------------------------------------------------------------------------------- duplicate keys


def test_duplicate_keys_are_refused_naming_both_lines(tmp_path: Path) -> None:
    text = (HEAD + "spec:\n  train:\n    steps: 3\n  task:\n    groupSize: 2\n    groupSize: 4\n"
            "  train:\n    steps: 9\nmetadata: {name: dup}\n")
    assert text.splitlines()[3] == text.splitlines()[8] == "  train:"  # train at lines 4 and 9
    path = _write(tmp_path, "dup.yaml", text)
    lines = _lines(path)
    assert len(lines) == 2, lines
    assert f"{path}: spec.task.groupSize: key 'groupSize' is given twice, at line 7 and at line 8" in lines[0]
    assert f"{path}: spec.train: key 'train' is given twice, at line 4 and at line 9" in lines[1]
    assert "merge the two into one" in lines[1]


def test_a_document_with_a_duplicate_key_still_shows_its_other_problems_and_never_runs() -> None:
    from asyncrl.api.validation import _jobs_of

    text = HEAD + "metadata: {name: d}\nspec:\n  async: {maxStaleness: 65}\n  async: {maxStaleness: 1}\n" \
                  "  train: {stepz: 3}\n"
    read = _jobs_of(parse_documents(text, "f"))
    assert read.jobs == []
    assert [p.path for p in read.problems] == ["spec.async", "spec.train.stepz"]


def test_a_merge_key_override_is_not_a_duplicate() -> None:
    text = HEAD + "metadata: {name: merged}\nspec:\n  rollout: &base {replicas: 2, gpusPerReplica: 0}\n" \
                  "  actor: {<<: {replicas: 1, gpusPerReplica: 1}, gpusPerReplica: 0}\n"
    (job,) = load_jobs_from_text(text)
    assert job.spec.actor.gpus_per_replica == 0


# ------------------------------------------------------------------------------ sizes, depth, bytes, paths


def test_a_file_over_the_size_cap_is_refused_before_parsing(tmp_path: Path) -> None:
    # invalid YAML past the cap: only the size is reported, so nothing was parsed
    path = _write(tmp_path, "big.yaml", b"a: [" + b" " * MAX_FILE_BYTES + b"\n")
    (line,) = _lines(path)
    assert line == (f"{path}: is larger than {MAX_FILE_BYTES} bytes (1 MiB), the most a job file may be (a job is a "
                    f"few KiB); remove what is not the job, or split the file: it has {MAX_FILE_BYTES + 5} bytes")
    ok = _write(tmp_path, "padded.yaml", QUICKSTART.read_text() + "#" * (MAX_FILE_BYTES // 2) + "\n")
    assert read_job_file(ok).problems == []


@pytest.mark.parametrize("text", [
    "a: " + "[" * 20000 + "]" * 20000,  # flow: libyaml's own limit (1000) is met first
    "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n",  # block: ours
], ids=["flow-20000", "block-200"])
def test_deep_nesting_is_refused_without_a_recursion_error(text: str) -> None:
    (problem,) = parse_documents(text, "deep.yaml").problems
    assert f"nesting deeper than {MAX_DEPTH} levels at line " in problem.message
    assert "check the indentation or unbalanced brackets" in problem.message


def test_non_utf8_bytes_name_the_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "latin1.yaml", (HEAD + "metadata: {name: caf\xe9}\n").encode("latin-1"))
    (line,) = _lines(path)
    # offset: len("apiVersion: asyncrl.io/v1alpha1\n") + len("kind: AsyncRLJob\n") + len("metadata: {name: caf") = 32+17+20
    assert line == (f"{path}: not UTF-8: byte 0xe9 at line 3, column 21 (offset 69); save the file as UTF-8")


def test_a_directory_and_a_missing_file(tmp_path: Path) -> None:
    assert _lines(tmp_path) == [f"{tmp_path}: is a directory, not a job file; name the YAML files in it "
                                "(e.g. DIR/*.yaml)"]
    assert _lines(tmp_path / "nope.yaml") == [f"{tmp_path / 'nope.yaml'}: no such file; check the path"]


def test_a_python_tag_is_refused() -> None:
    (problem,) = parse_documents(HEAD + "metadata: !!python/object/apply:os.system [id]\n", "f").problems
    assert "cannot be read as plain data" in problem.message and "no !!python tags" in problem.message


def test_syntax_errors_are_one_line_with_the_position() -> None:
    (problem,) = parse_documents(HEAD + "metadata: {name: x\nspec: 3\n", "f").problems
    assert "\n" not in problem.message and problem.message.startswith("not valid YAML: ")
    assert " at line 4, column " in problem.message


# ------------------------------------------------------------------ several documents, kinds, metadata


def test_every_problem_of_every_document_at_once(tmp_path: Path) -> None:
    text = "\n---\n".join([
        QUICKSTART.read_text(),
        HEAD + "metadata: {name: two}\nspec: {async: {maxStaleness: true}, train: {learningRate: .inf}}",
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRlJob\nmetadata: {name: three, lables: {a: b}}",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: skipped}",
        "- just\n- a list",
    ])
    path = _write(tmp_path, "many.yaml", text)
    read = read_job_file(path)
    assert [j.metadata.name for j in read.jobs] == ["quickstart"]
    lines = [str(p) for p in read.problems]
    assert lines == [
        "document 2 (two): spec.async.maxStaleness: expected an integer, got true (a boolean); write a whole number "
        "without quotes or a decimal point, e.g. 3",
        "document 2 (two): spec.train.learningRate: expected a finite number, got .inf; .inf and .nan are not "
        "allowed: give a number",
        "document 3 (three): kind: got 'AsyncRlJob'; did you mean AsyncRLJob? (kinds are case-sensitive); expected "
        "apiVersion: asyncrl.io/v1alpha1 and kind: AsyncRLJob",
        "document 3 (three): metadata.lables: unknown field; did you mean 'labels'? valid fields here: name, "
        "namespace, labels, annotations, generateName, uid, resourceVersion, generation, creationTimestamp, "
        "deletionTimestamp, deletionGracePeriodSeconds, selfLink, ownerReferences, finalizers, managedFields",
        "document 5: (document): got a list; expected a mapping with apiVersion, kind, metadata and spec",
    ]
    with pytest.raises(SpecError) as info:
        load_jobs(path)
    assert len(info.value.problems) == 5


def test_a_syntax_error_in_a_later_document_keeps_the_earlier_ones() -> None:
    from asyncrl.api.validation import _jobs_of

    read = _jobs_of(parse_documents(QUICKSTART.read_text() + "---\n" + HEAD + "metadata: {name: [}\n", "f.yaml"))
    assert [j.metadata.name for j in read.jobs] == ["quickstart"]
    (problem,) = read.problems
    assert problem.document == 2 and problem.message.startswith("not valid YAML: ")


@pytest.mark.parametrize("kind", ["AsyncRlJob", "asyncrljob", "AsyncRLJobs", "AsyncJob", "Job"])
def test_a_kind_typo_says_did_you_mean(kind: str) -> None:
    from asyncrl.api.validation import _jobs_of

    doc = f"apiVersion: asyncrl.io/v1alpha1\nkind: {kind}\nmetadata: {{name: t}}\n"
    (problem,) = _jobs_of(parse_documents(doc, "f")).problems
    assert problem.path == "kind" and f"got {kind!r}" in problem.message
    assert ("did you mean AsyncRLJob?" in problem.message) == (kind != "Job")  # Job: only our group says it is ours


@pytest.mark.parametrize("api_version", ["asyncrl.io/v1alpa1", "asyncrl.io/v1", "asyncrl/v1alpha1"])
def test_an_api_version_typo_says_did_you_mean(api_version: str) -> None:
    from asyncrl.api.validation import _jobs_of

    doc = f"apiVersion: {api_version}\nkind: AsyncRLJob\nmetadata: {{name: t}}\n"
    (problem,) = _jobs_of(parse_documents(doc, "f")).problems
    assert problem.path == "apiVersion" and "did you mean asyncrl.io/v1alpha1?" in problem.message


def test_a_file_of_other_kinds_lists_what_it_found(tmp_path: Path) -> None:
    path = _write(tmp_path, "ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: rl}\n---\n"
                                       "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n")
    (line,) = _lines(path)
    assert "no AsyncRLJob document found (found only 'Namespace' (document 1), 'Secret' (document 2))" in line
    assert "the file is empty" in _lines(_write(tmp_path, "empty.yaml", "# nothing\n---\n"))[0]


@pytest.mark.parametrize(("key", "meant"), [("lables", "labels"), ("namespce", "namespace"),
                                            ("anotations", "annotations"), ("nmae", "name")])
def test_unknown_metadata_keys_say_did_you_mean(key: str, meant: str) -> None:
    from asyncrl.api.validation import validate_job

    meta = {"name": "t", key: "x"} if key != "nmae" else {"nmae": "t"}
    with pytest.raises(SpecError) as info:
        validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": meta})
    assert f"did you mean '{meant}'" in str(info.value)


def test_metadata_the_server_writes_is_accepted() -> None:
    from asyncrl.api.validation import validate_job

    meta = {"name": "t", "namespace": "rl", "uid": "u", "resourceVersion": "7", "generation": 2,
            "creationTimestamp": "2026-12-01T00:00:00Z", "managedFields": [{"manager": "kubectl"}],
            "finalizers": ["asyncrl.io/cleanup"], "ownerReferences": [], "generateName": "t-"}
    assert validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": meta}).metadata.uid


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN", ".Inf"])
@pytest.mark.parametrize("field", ["train.learningRate", "task.temperature", "train.weightDecay",
                                   "train.maxGradNorm", "correction.clip.high", "correction.mask.vetoBelow"])
def test_inf_and_nan_from_yaml_are_refused(field: str, value: str) -> None:
    from asyncrl.api.validation import _jobs_of

    section, _, key = field.rpartition(".")
    nested = "".join(f"{p}: {{" for p in section.split(".")) + f"{key}: {value}" + "}" * len(section.split("."))
    read = _jobs_of(parse_documents(HEAD + f"metadata: {{name: t}}\nspec: {{{nested}}}\n", "f"))
    (problem,) = read.problems
    assert problem.path == f"spec.{field}" and "expected a finite number" in problem.message


# ------------------------------------------------------------------------------------ the command line


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``asyncrl ARGS`` in a fresh interpreter; prints whether Ray was imported, so a refusal is proven
    to come before any process starts."""
    code = ("import sys; from asyncrl.trainer.cli import main; rc = main(sys.argv[1:]); "
            "print('ray imported:', 'ray' in sys.modules); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_validate_reports_every_bad_file_and_still_reads_the_later_ones(tmp_path: Path) -> None:
    files = [
        _write(tmp_path, "bomb.yaml", BILLION_LAUGHS),
        _write(tmp_path, "latin1.yaml", b"metadata: {name: caf\xe9}\n"),
        tmp_path,
        tmp_path / "missing.yaml",
        _write(tmp_path, "dup.yaml", HEAD + "metadata: {name: d}\nspec: {}\nspec: {}\n"),
        QUICKSTART,
    ]
    run = _cli("validate", *map(str, files))
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [str(f) for f in files[:-1]]  # one line each, in order
    assert f"{QUICKSTART}: AsyncRLJob quickstart is valid" in run.stdout
    assert "ray imported: False" in run.stdout


def test_run_and_driver_refuse_a_bomb_before_ray(tmp_path: Path) -> None:
    bomb = _write(tmp_path, "bomb.yaml", BILLION_LAUGHS)
    for args in (("run", str(bomb), "--run-dir", str(tmp_path / "run")), ("driver", "--spec", str(bomb))):
        run = _cli(*args)
        assert run.returncode == 2, run.stderr
        assert f"{bomb}: spec.rollout.template.affinity." in run.stderr and "Traceback" not in run.stderr
        assert "ray imported: False" in run.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("run", "--port", "70000"), "argument --port: 70000 is out of range: give a port (0 = any free port) 0..65535"),
    (("run", "--port", "http"), "argument --port: 'http' is not a port (0 = any free port): give an integer"),
    (("run", "--steps", "0"), "argument --steps: 0 is out of range: give a step count 1..1000000"),
    (("driver", "--spec", "x", "--port", "-1"), "argument --port: -1 is out of range"),
    (("driver", "--spec", "x", "--wait-timeout", "nan"), "argument --wait-timeout: nan is out of range: give "
                                                         "seconds, a finite number > 0"),
    (("probe", "gcs", "--address", "h:1", "--interval", "0"), "argument --interval: 0 is out of range"),
    (("thresholds", "--mask", "0.5", "inf", "--clip", "0.9", "1.1", "--gap", "1", "--interp", "linear"),
     "argument --mask: inf is out of range: give a ratio, a finite number > 0"),
    (("thresholds", "--mask", "0.5", "2", "--clip", "0.9", "1.1", "--gap", "-1", "--interp", "linear"),
     "argument --gap: -1 is out of range: give a version gap 0..1000000"),
])
def test_numeric_options_are_checked_by_argparse(args: tuple[str, ...], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.trainer.cli import main

    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("usage: asyncrl ") and "Traceback" not in err


def test_a_dump_of_a_valid_job_reads_back_under_strict_types(tmp_path: Path) -> None:
    # job.yaml in the run directory and the operator's ConfigMap are dumps: strict scalars must take them
    (job,) = load_jobs(QUICKSTART)
    dumped = _write(tmp_path, "job.yaml", yaml.safe_dump(job.model_dump(mode="json", by_alias=True), sort_keys=False))
    (again,) = load_jobs(dumped)
    assert again == job
    assert read_documents(dumped).count == 1


def test_keys_that_look_like_pydantic_steps_or_hold_newlines_stay_one_line() -> None:
    from asyncrl.api.validation import _jobs_of

    # 'kind[' once crashed the error formatter (IndexError): a '[' in a key was taken for a pydantic step
    text = HEAD + 'kind[: x\nmetadata: {name: k}\nspec: {"tr\\nain": 1}\n'
    lines = sorted(str(p) for p in _jobs_of(parse_documents(text, "f")).problems)
    assert lines == [
        "kind[: unknown field; did you mean 'kind'? valid fields here: apiVersion, kind, metadata, spec, status",
        "spec.'tr\\nain': unknown field; did you mean 'train'? valid fields here: correction, oldLogits, async, "
        "model, task, train, checkpoint, eval, rollout, actor, driver, runPolicy, scheduling, monitoring",
    ]  # (sorted)


def test_mangled_job_files_never_raise_and_every_problem_is_one_line() -> None:
    import random

    from asyncrl.api.validation import _jobs_of

    base = (ROOT / "examples" / "production.yaml").read_text() + "\n---\n" + QUICKSTART.read_text()
    pieces = [*":{}[]-&*!|>'\"#%@`,? \n\t.x0", "<<", "---", "&a", "*a", "!!str", "!!map", "\\u0000", "\xff"]
    rng = random.Random(0)  # seeded: the same 300 mangled files every run
    for _ in range(300):
        chars = list(base)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(chars))
            if rng.random() < 0.5:
                chars.insert(at, rng.choice(pieces))
            else:
                del chars[at]
        for problem in _jobs_of(parse_documents("".join(chars), "f")).problems:
            assert "\n" not in str(problem), problem
