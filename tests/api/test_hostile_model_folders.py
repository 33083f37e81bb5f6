"""Hostile and careless model folders (``tests/support/hostile_model_folders.py``): each is refused by its
own reader with one line naming the file or field, the bad value and the fix, and by the whole pre-check
of ``asyncrl run`` with exactly one printed line; the legitimate ones keep working. A folder's code is
never run and never asks; a chat template that would loop for hours is stopped at its time limit."""

import ast
import json
import shutil
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import (
    PRESETS,
    ModelArch,
    folder_problems,
    hf_param_shapes,
    parameter_count,
    resolve_arch,
    tensor_count,
)
from asyncrl.rollout import tokenizer as tokenizer_module
from asyncrl.rollout.time_limit import TimeLimitError, call_within
from asyncrl.rollout.tokenizer import HFTokenizer, render_chat
from asyncrl.trainer.cli.commands import _model_folder_refused, main
from asyncrl.trainer.megatron.hf_folder import FolderError, HFFolder
from tests.support.hf_models import tiny_folder
from tests.support.hostile_model_folders import (
    HOSTILE_FOLDERS,
    NESTED_LOOPS,
    ROWS,
    HostileFolder,
    hub_cache_layout,
)

REPO = Path(__file__).resolve().parents[2]
REFUSED = [row for row in HOSTILE_FOLDERS if row.reader != "survives"]
SURVIVING = [row for row in HOSTILE_FOLDERS if row.reader == "survives"]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("good"), "qwen3", max_shard_size="60KB")


def _make(good: Path, tmp_path: Path, row: HostileFolder) -> Path:
    folder = Path(shutil.copytree(good, tmp_path / "model"))
    outside = tmp_path / "outside"
    outside.mkdir()
    row.edit(folder, outside)
    return folder


def _own_refusal(row: HostileFolder, folder: Path) -> str:
    """The refusal of ``row``'s own reader, alone (no other check ran first)."""
    if row.reader == "validate":
        problems = folder_problems(ModelSpec(weights=str(folder)))
        assert len(problems) == 1, problems
        return problems[0]
    with pytest.raises(ValueError) as err:
        if row.reader == "weights":
            HFFolder(folder)
        else:
            HFTokenizer.from_folder(folder)
    if row.reader == "weights":
        assert isinstance(err.value, FolderError)
    return str(err.value)


@pytest.mark.parametrize("row", REFUSED, ids=lambda r: r.name)
def test_a_hostile_folder_is_refused_in_one_line_by_its_reader_and_by_the_precheck(
    row: HostileFolder, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _make(good, tmp_path, row)
    line = _own_refusal(row, folder)
    assert "\n" not in line
    for fragment in row.fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    # what `asyncrl run` and the driver run before Ray starts: exactly one line, naming the folder
    capsys.readouterr()
    assert _model_folder_refused(ModelSpec(weights=str(folder)), "job.yaml")
    printed = capsys.readouterr().err.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("job.yaml: ") and str(folder) in printed[0], printed


@pytest.mark.parametrize("row", [r for r in REFUSED if r.reader == "validate"], ids=lambda r: r.name)
def test_asyncrl_validate_refuses_the_config_rows(
    row: HostileFolder, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncrl.api.validation import quickstart_doc

    folder = _make(good, tmp_path, row)
    doc = quickstart_doc()
    doc["spec"]["model"] = {"weights": str(folder), "rolloutDtype": "float32"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert main(["validate", str(job)]) == 1
    (printed,) = capsys.readouterr().err.strip().splitlines()
    assert printed.startswith(f"{job}: spec.model.weights: ") and row.fragments[0] in printed


def _works_like(good: Path, folder: Path) -> None:
    assert not _model_folder_refused(ModelSpec(weights=str(folder)), "job.yaml")
    assert HFFolder(folder).shapes() == HFFolder(good).shapes()
    tok, ref = HFTokenizer.from_folder(folder), HFTokenizer.from_folder(good)
    assert tok.chat_prompt("sys", "2+2?") == ref.chat_prompt("sys", "2+2?") and tok.eos_id == ref.eos_id


@pytest.mark.parametrize("row", SURVIVING, ids=lambda r: r.name)
def test_a_legitimate_folder_keeps_working(row: HostileFolder, good: Path, tmp_path: Path) -> None:
    _works_like(good, _make(good, tmp_path, row))


def test_a_hub_cache_snapshot_whose_files_link_into_its_blobs_keeps_working(good: Path, tmp_path: Path) -> None:
    outside = tmp_path / "hub"
    outside.mkdir()
    snapshot = hub_cache_layout(good, outside)
    assert (snapshot / "config.json").is_symlink()
    _works_like(good, snapshot)


def test_the_table_covers_every_reader() -> None:
    assert {r.reader for r in HOSTILE_FOLDERS} == {"validate", "weights", "tokenizer", "survives"}
    assert len(ROWS) == len(HOSTILE_FOLDERS)  # names are unique


# ------------------------------------------------------------------------------ a folder's code never runs
EVIL = textwrap.dedent('''
    import pathlib
    pathlib.Path({marker!r}).write_text("ran")
    from transformers import PreTrainedTokenizerFast
    class EvilTokenizer(PreTrainedTokenizerFast):
        pass
    from transformers import Qwen3Config
    class EvilConfig(Qwen3Config):
        pass
''')
LOADER = textwrap.dedent('''
    import json, sys
    from asyncrl.rollout.tokenizer import HFTokenizer
    for folder in sys.argv[1:]:
        try:
            HFTokenizer.from_folder(folder)
            print(json.dumps([folder, "loaded"]))
        except ValueError as exc:
            print(json.dumps([folder, str(exc)]))
''')


def _with_auto_map(source: Path, folder: Path, marker: Path, case: str) -> Path:
    folder = Path(shutil.copytree(source, folder))
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    if case == "config":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilConfig"}
        (folder / "config.json").write_text(json.dumps(cfg))
    else:
        tok_cfg["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
        if case == "no-class":
            tok_cfg.pop("tokenizer_class", None)
        elif case == "code-class":
            tok_cfg["tokenizer_class"] = "EvilTokenizer"  # a class only evil.py defines
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return folder


def test_a_folder_with_auto_map_runs_no_code_and_asks_nothing(
    good: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    marker = tmp_path / "MARKER"
    llama = tiny_folder(tmp_path_factory.mktemp("llama"), "llama")
    folders = {  # transformers falls back to its own class for qwen3, has none for this llama without a class
        "qwen3 no-class": _with_auto_map(good, tmp_path / "q1", marker, "no-class"),
        "qwen3 code-class": _with_auto_map(good, tmp_path / "q2", marker, "code-class"),
        "qwen3 config": _with_auto_map(good, tmp_path / "q3", marker, "config"),
        "llama no-class": _with_auto_map(llama, tmp_path / "l1", marker, "no-class"),
    }
    # stdin answers "y" to every prompt: before trust_remote_code=False, transformers asked [y/N] and ran evil.py
    done = subprocess.run([sys.executable, "-c", LOADER, *map(str, folders.values())], input="y\n" * 8,
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[y/N]" not in done.stdout + done.stderr and "custom code" not in done.stdout + done.stderr
    assert not marker.exists()
    results = dict(json.loads(line) for line in done.stdout.splitlines() if line.startswith("["))
    assert [results[str(folders[k])] for k in ("qwen3 no-class", "qwen3 code-class", "qwen3 config")] == [
        "loaded"] * 3  # auto_map ignored
    refused = results[str(folders["llama no-class"])]
    assert refused.startswith(f"tokenizer of {folders['llama no-class']}: tokenizer_config.json's auto_map names the "
                              "folder's own Python code, which asyncrl never runs (trust_remote_code=False)")
    assert "\n" not in refused and "set tokenizer_class" in refused


def test_every_from_pretrained_call_of_the_tree_passes_trust_remote_code_false() -> None:
    calls = []
    for package in ("api", "trainer", "rollout", "bench", "operator"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                    kw = {k.arg: k.value for k in node.keywords}
                    safe = isinstance(kw.get("trust_remote_code"), ast.Constant) and kw["trust_remote_code"].value is False
                    calls.append((f"{path.relative_to(REPO)}:{node.lineno}", safe))
    assert len(calls) >= 5  # rollout/tokenizer.py, rollout/smollm.py (2), bench/models.py (2)
    assert [where for where, safe in calls if not safe] == []


# ------------------------------------------------------------------------------ chat templates are bounded
def _in_a_thread(fn: object) -> BaseException | object:
    """Run ``fn()`` in a worker thread, as a Ray actor's or rollout worker's thread would (signals reach only
    the main thread); returns its result or exception. The join timeout only guards the suite against the
    bug under test (1e10 loop iterations would take hours)."""
    out: list[object] = []
    finished = threading.Event()

    def work() -> None:
        try:
            out.append(fn())  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 -- returned to the test
            out.append(exc)
        finished.set()

    threading.Thread(target=work, daemon=True).start()
    assert finished.wait(timeout=300), "the render was not stopped"
    return out[0]


def test_a_chat_template_with_nested_loops_is_refused_at_load_within_the_limit(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(shutil.copytree(good, tmp_path / "model"))
    (folder / "chat_template.jinja").write_text(NESTED_LOOPS)
    monkeypatch.setattr(tokenizer_module, "TEMPLATE_RENDER_LIMIT_S", 0.5)
    err = _in_a_thread(lambda: HFTokenizer.from_folder(folder))
    assert isinstance(err, TimeLimitError), err
    assert "\n" not in str(err)
    assert str(err).startswith(f"the chat template of {folder} ran past its 0.5 s limit and was stopped")
    assert "fix or replace the folder's chat_template.jinja" in str(err)


def test_a_template_that_hangs_only_on_a_later_conversation_is_stopped_on_that_render(
    good: Path, tmp_path: Path
) -> None:
    folder = Path(shutil.copytree(good, tmp_path / "model"))
    template = (good / "chat_template.jinja").read_text()
    # loads (the load's probe render has two messages), then hangs on any prompt with a system message
    (folder / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] == 'system' %}" + NESTED_LOOPS + "{% endif %}" + template)
    tok = HFTokenizer.from_folder(folder)
    err = _in_a_thread(lambda: render_chat(tok.hf, [{"role": "system", "content": "s"}], limit_s=0.3))
    assert isinstance(err, TimeLimitError) and "ran past its 0.3 s limit" in str(err)
    assert render_chat(tok.hf, [{"role": "user", "content": "q"}]) == render_chat(
        HFTokenizer.from_folder(good).hf, [{"role": "user", "content": "q"}])  # the same tokenizer renders on


def test_a_call_that_returns_first_leaves_no_exception_behind() -> None:
    # the limit is so short that the timer often fires while or just after the call returns: every outcome
    # is the value or a TimeLimitError from inside call_within; a stray exception would fail this loop
    outcomes = {"value": 0, "stopped": 0}
    for _ in range(300):
        try:
            assert call_within(1e-4, "x", sum, range(200)) == 19900
            outcomes["value"] += 1
        except TimeLimitError:
            outcomes["stopped"] += 1
        total = sum(range(2000))  # bytecode after the call, where a leaked exception would surface
        assert total == 1999000
    assert outcomes["value"] + outcomes["stopped"] == 300


# ------------------------------------------------------------------------------ size estimate before allocation
def test_parameter_and_tensor_counts_equal_the_shape_table() -> None:
    # tiny-llama, vocab 28, by hand: H 128, 2 layers, 4 heads, 2 KV heads (hn 32), SwiGLU 256, tied.
    # per layer: q 128*128 + k 64*128 + v 64*128 + o 128*128 = 49152; MLP 3*256*128 = 98304; norms 256
    #   -> 147712; two layers 295424; embedding 28*128 = 3584; final norm 128 -> 299136 parameters;
    # tensors: 1 + 2 * (6 + 3) + 1 = 20
    tiny = replace(PRESETS["tiny-llama"], vocab_size=28)
    assert (parameter_count(tiny), tensor_count(tiny)) == (299136, 20)
    examples = [
        tiny,
        ModelArch(64, 2, 4, 2, 128, 300, 256, False, family="qwen2"),
        ModelArch(64, 2, 4, 2, 128, 300, 256, False, family="qwen3", kv_channels=32),
        ModelArch(64, 3, 4, 2, 128, 300, 256, True, family="qwen3_moe", kv_channels=16, num_experts=4, moe_top_k=2,
                  moe_ffn_hidden_size=32),
    ]
    for arch in examples:
        shapes = hf_param_shapes(arch, with_tied_head=False)
        numel = sum(a * b for s in shapes.values() for a, b in [(s[0], s[1] if len(s) > 1 else 1)])
        assert (parameter_count(arch), tensor_count(arch)) == (numel, len(shapes)), arch.family


def test_a_good_folder_still_resolves(good: Path) -> None:
    assert folder_problems(ModelSpec(weights=str(good))) == []
    assert resolve_arch(ModelSpec(weights=str(good)), 1).vocab_size == 266
