"""One table of hostile and careless model folders (``spec.model.weights``), in the style of ``BAD_INPUTS``.

Each :class:`HostileFolder` breaks exactly one thing of a copy of a good tiny sharded Qwen3 folder
(``tests/support/hf_models.py``), using files outside it where the case needs them:

- ``edit(folder, outside)``: makes the case; ``outside`` is a sibling folder the user did not name
  (where a "secret" lives);
- ``reader``: which reader must refuse it on its own, without the others' help: ``validate``
  (``asyncrl.api.model_arch.folder_problems``, what ``asyncrl validate`` runs, no torch), ``weights``
  (``HFFolder``, what the actor opens), ``tokenizer`` (``HFTokenizer.from_folder``, what the actor and
  every rollout worker load), or ``survives`` (a legitimate folder that must keep working);
- ``fragments``: what the one-line refusal must contain: the file or field, the bad value, the fix;
- ``before``: what main did with it (measured at d62693c, before these checks): ``validate`` is
  ``asyncrl validate``'s folder check, ``run`` the pre-check ``asyncrl run`` and the driver run.

Used by ``tests/api/test_hostile_model_folders.py``, which also runs every refused row through the
whole pre-check of ``asyncrl run`` (exactly one printed line each).
"""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Reader = Literal["validate", "weights", "tokenizer", "survives"]
INDEX = "model.safetensors.index.json"
FIX_CONFIG = "correct it in config.json"
MIB = 1 << 20


@dataclass(frozen=True)
class HostileFolder:
    name: str
    edit: Callable[[Path, Path], None]
    reader: Reader
    fragments: tuple[str, ...] = ()
    before: str = ""


# ------------------------------------------------------------------------------------------- edits
def config(**fields: Any) -> Callable[[Path, Path], None]:
    """Set (or, with value ``...``, delete) fields of config.json."""

    def edit(folder: Path, outside: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        for k, v in fields.items():
            if v is ...:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (folder / "config.json").write_text(json.dumps(cfg))

    return edit


def config_text(text: str) -> Callable[[Path, Path], None]:
    def edit(folder: Path, outside: Path) -> None:
        (folder / "config.json").write_text(text)

    return edit


def sparse(name: str, size: int) -> Callable[[Path, Path], None]:
    """Make ``name`` ``size`` bytes long without writing them (a sparse file: the cap must act on its
    size, before reading a byte)."""

    def edit(folder: Path, outside: Path) -> None:
        with open(folder / name, "r+b" if (folder / name).exists() else "wb") as f:
            f.truncate(size)

    return edit


def link_out(name: str) -> Callable[[Path, Path], None]:
    """Replace ``name`` by a symbolic link to a copy of it outside the folder (the "secret" the export, the
    loaders or the pre-check would read)."""

    def edit(folder: Path, outside: Path) -> None:
        secret = outside / f"secret-{name.replace('/', '_')}"
        secret.write_bytes((folder / name).read_bytes() if (folder / name).is_file() else b"{}")
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(secret)

    return edit


def index_shard(value: Callable[[Path, Path], Any]) -> Callable[[Path, Path], None]:
    """Point the first tensor of the shard index at ``value(folder, outside)`` (a copy of its shard placed
    there, so the path would work if it were followed)."""

    def edit(folder: Path, outside: Path) -> None:
        doc = json.loads((folder / INDEX).read_text())
        first = sorted(doc["weight_map"])[0]
        doc["weight_map"][first] = value(folder, outside)
        (folder / INDEX).write_text(json.dumps(doc))

    return edit


def _outside_copy(folder: Path, outside: Path) -> Path:
    doc = json.loads((folder / INDEX).read_text())
    shard = doc["weight_map"][sorted(doc["weight_map"])[0]]
    target = outside / "stolen.safetensors"
    target.write_bytes((folder / shard).read_bytes())
    return target


def _dotdot(folder: Path, outside: Path) -> str:
    return os.path.relpath(_outside_copy(folder, outside), folder)  # ../outside/stolen.safetensors


def _absolute(folder: Path, outside: Path) -> str:
    return str(_outside_copy(folder, outside))


def fifo_shard(folder: Path, outside: Path) -> None:
    """The first shard becomes a FIFO: opening it would block the actor forever."""
    shard = sorted(p for p in folder.glob("*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(shard)


def index_text(text: str) -> Callable[[Path, Path], None]:
    def edit(folder: Path, outside: Path) -> None:
        (folder / INDEX).write_text(text)

    return edit


def tokenizer_config(**fields: Any) -> Callable[[Path, Path], None]:
    def edit(folder: Path, outside: Path) -> None:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        for k, v in fields.items():
            if v is ...:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))

    return edit


def fast_tokenizer_file_out(folder: Path, outside: Path) -> None:
    (outside / "secret.json").write_text((folder / "tokenizer.json").read_text())
    tokenizer_config(fast_tokenizer_files=[os.path.relpath(outside / "secret.json", folder)])(folder, outside)


def templates_dir_out(folder: Path, outside: Path) -> None:
    (outside / "templates").mkdir()
    (outside / "templates" / "tool_use.jinja").write_text("{{ messages }}")
    (folder / "additional_chat_templates").symlink_to(outside / "templates")


def generation(value: Any) -> Callable[[Path, Path], None]:
    def edit(folder: Path, outside: Path) -> None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))

    return edit


def hub_cache_layout(folder: Path, outside: Path) -> Path:
    """``folder`` rebuilt as ``huggingface_hub`` caches it: ``models--org--tiny/snapshots/<rev>/<file>``
    links to ``../../blobs/<name>``. Returns the snapshot folder (what a user would name)."""
    repo = outside / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for p in sorted(folder.iterdir()):
        blob = repo / "blobs" / f"blob-{p.name}"
        blob.write_bytes(p.read_bytes())
        (snapshot / p.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def link_inside(folder: Path, outside: Path) -> None:
    """tokenizer.json as a link to a file in a subfolder of the model folder (inside: fine)."""
    (folder / "tok").mkdir()
    (folder / "tokenizer.json").rename(folder / "tok" / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(Path("tok") / "tokenizer.json")


# ------------------------------------------------------------------------------------------- the table
NESTED_LOOPS = ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
                "{{ messages[0]['content'] }}")  # 1e10 empty iterations: hours of pure-Python jinja

HOSTILE_FOLDERS: tuple[HostileFolder, ...] = (
    # config.json: types strict, sizes bounded (the spec's own bounds where it has the override)
    HostileFolder("vocab-1e12", config(vocab_size=10**12), "validate",
                  ("config.json: vocab_size 1000000000000 is outside [1, 1048576]", FIX_CONFIG),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("layers-1e6", config(num_hidden_layers=10**6), "validate",
                  ("num_hidden_layers 1000000 is outside [1, 1024] (spec.model.numLayers's bound too)", FIX_CONFIG),
                  before='validate: valid; run: 119.7 s and 2.5 GiB peak on a busy machine (38.7 s idle), then a shape mismatch'),
    HostileFolder("heads-0", config(num_attention_heads=0), "validate",
                  ("num_attention_heads 0 is outside [1, 1024] (spec.model.numAttentionHeads's bound too)",),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("kv-heads-0", config(num_key_value_heads=0), "validate",
                  ("num_key_value_heads 0 is outside [1, 1024]",), before='validate: valid (0 read as num_attention_heads); run: a shape mismatch'),
    HostileFolder("hidden-too-big", config(hidden_size=65537), "validate",
                  ("hidden_size 65537 is outside [8, 65536] (spec.model.hiddenSize's bound too)",),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("ffn-too-big", config(intermediate_size=262145), "validate",
                  ("intermediate_size 262145 is outside [8, 262144] (spec.model.ffnHiddenSize's bound too)",),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("head-dim-negative", config(head_dim=-1), "validate", ("head_dim -1 is outside [1, 1024]",),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("positions-too-many", config(max_position_embeddings=10**9), "validate",
                  ("max_position_embeddings 1000000000 is outside [1, 1048576]",),
                  before='validate: valid; run: accepted'),
    HostileFolder("eps-string", config(rms_norm_eps="abc"), "validate",
                  ('rms_norm_eps "abc" is a string, not a number', FIX_CONFIG),
                  before='ValueError traceback (could not convert string to float)'),
    HostileFolder("eps-zero", config(rms_norm_eps=0), "validate", ("rms_norm_eps 0 is outside (0, 1)",),
                  before="validate: valid; run: transformers' StrictDataclassFieldValidationError traceback"),
    HostileFolder("eps-nan", config(rms_norm_eps=float("nan")), "validate", ("rms_norm_eps NaN is not a finite number",),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("rope-theta-inf", config(rope_parameters={"rope_type": "default", "rope_theta": 1e400}), "validate",
                  ("rope_parameters.rope_theta Infinity is not a finite number",), before='validate: valid; run: accepted'),
    HostileFolder("hidden-bool", config(hidden_size=True), "validate",
                  ("hidden_size true is a boolean, not an integer",), before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("layers-float", config(num_hidden_layers=2.0), "validate",
                  ("num_hidden_layers 2.0 is a number, not an integer",), before='refused as a missing integer field'),
    HostileFolder("tie-string", config(tie_word_embeddings="no"), "validate",
                  ('tie_word_embeddings "no" is a string, not true or false',), before="validate: valid; run: transformers' StrictDataclassFieldValidationError traceback"),
    HostileFolder("vocab-missing", config(vocab_size=...), "validate", ("vocab_size is missing",),
                  before="refused: missing integer field(s) ['vocab_size']"),
    HostileFolder("architectures-string", config(architectures="Qwen3ForCausalLM"), "validate",
                  ('architectures "Qwen3ForCausalLM" is a string, not a list',), before='refused, the string read letter by letter'),
    HostileFolder("architectures-number", config(architectures=7), "validate",
                  ("architectures 7 is an integer, not a list",), before='TypeError traceback'),
    HostileFolder("three-at-once", config(vocab_size=10**12, num_hidden_layers=0, rms_norm_eps="x"), "validate",
                  ("vocab_size 1000000000000", "num_hidden_layers 0", 'rms_norm_eps "x"'),
                  before='ValueError traceback naming only rms_norm_eps'),
    HostileFolder("parameters-over-cap", config(hidden_size=65536, num_hidden_layers=1024, intermediate_size=262144,
                                                head_dim=128, num_attention_heads=512, num_key_value_heads=512),
                  "validate", ("over MAX_PARAMETERS 2e+12", "correct the sizes in config.json"),
                  before='validate: valid; run: refused as a shape mismatch'),
    HostileFolder("tensors-over-cap", config(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                                             num_hidden_layers=1024, num_experts=1024, num_experts_per_tok=2,
                                             moe_intermediate_size=32),
                  "validate", ("over MAX_TENSORS 262144",), before='validate: valid; run: a 3.1M-name table (1.2 GiB peak), then a shape mismatch'),
    HostileFolder("config-not-object", config_text("[1, 2]"), "validate", ("holds JSON list, not an object",),
                  before='TypeError traceback'),
    HostileFolder("config-deep", config_text("[" * 100_000 + "]" * 100_000), "validate",
                  ("config.json: not readable JSON (nested too deeply)",), before='RecursionError traceback'),
    HostileFolder("config-2mib", config(padding="x" * (2 * MIB)), "validate",
                  ("config.json: 2097", "over the 1048576-byte limit for config.json (CONFIG_MAX_BYTES)"),
                  before='valid (read whole)'),
    HostileFolder("config-link-out", link_out("config.json"), "validate",
                  ("config.json: a symbolic link to", "outside", "copy the file into the folder"),
                  before='valid: the file outside was read as config.json'),
    # the shard index and the weight files
    HostileFolder("index-dotdot", index_shard(_dotdot), "weights",
                  (f"{INDEX}: '../outside/stolen.safetensors' has a '..' part",),
                  before='accepted: a shard outside the folder was opened'),
    HostileFolder("index-absolute", index_shard(_absolute), "weights", ("is an absolute path",),
                  before='accepted: the absolute path was opened'),
    HostileFolder("index-not-name", index_shard(lambda f, o: 7), "weights", ("weight_map value 7 is not a file name",),
                  before='TypeError traceback'),
    HostileFolder("index-no-map", index_text('{"metadata": {}}'), "weights", ("no 'weight_map' object",),
                  before="refused (the KeyError's repr in the line)"),
    HostileFolder("shard-link-out", link_out("model-00001-of-00012.safetensors"), "weights",
                  ("model-00001-of-00012.safetensors: a symbolic link to", "outside"), before='accepted: the linked file outside was opened'),
    HostileFolder("shard-fifo", fifo_shard, "weights", ("not a regular file",), before='refused as a missing shard (is_file is False for a FIFO)'),
    HostileFolder("index-16mib", sparse(INDEX, 17 * MIB), "weights", ("INDEX_MAX_BYTES",), before='read whole (17 MiB), then a JSON error'),
    # tokenizer files
    HostileFolder("tokenizer-link-out", link_out("tokenizer.json"), "tokenizer",
                  ("tokenizer.json: a symbolic link to", "outside"), before='accepted: the tokenizer outside was loaded'),
    HostileFolder("template-link-out", link_out("chat_template.jinja"), "tokenizer",
                  ("chat_template.jinja: a symbolic link to", "outside"), before='accepted (and exported as a regular file)'),
    HostileFolder("templates-dir-out", templates_dir_out, "tokenizer",
                  ("additional_chat_templates: a symbolic link to", "outside"), before='accepted: the templates outside were loaded'),
    HostileFolder("fast-tokenizer-file-out", fast_tokenizer_file_out, "tokenizer",
                  ("fast_tokenizer_files: '../outside/secret.json' has a '..' part",), before='accepted'),
    HostileFolder("tokenizer-65mib", sparse("tokenizer.json", 65 * MIB), "tokenizer",
                  ("over the 67108864-byte limit for tokenizer.json (TOKENIZER_JSON_MAX_BYTES)",), before='read whole: a JSON error after 872 MiB peak (548 MiB for the good folder)'),
    HostileFolder("template-2mib", sparse("chat_template.jinja", 2 * MIB), "tokenizer",
                  ("CHAT_TEMPLATE_MAX_BYTES",), before='accepted (read whole)'),
    HostileFolder("generation-eos-bool", generation(True), "tokenizer",
                  ("generation_config.json: eos_token_id true must be an integer id >= 0",), before='accepted: true read as id 1'),
    HostileFolder("generation-eos-string", generation(["2"]), "tokenizer", ('eos_token_id ["2"] must be',),
                  before='accepted: "2" read as id 2'),
    # legitimate folders that must keep working
    HostileFolder("link-inside", link_inside, "survives"),
    HostileFolder("auto-map-with-class", tokenizer_config(auto_map={"AutoTokenizer": [None, "evil.Evil"]}),
                  "survives", before="ignored on main too (tokenizer_class names a transformers class)"),
)
ROWS = {row.name: row for row in HOSTILE_FOLDERS}
