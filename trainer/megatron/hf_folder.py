"""A Hugging Face model folder's safetensors as a lazy, memory-mapped ``Mapping[str, Tensor]``.

``model.safetensors`` (one file), shards listed by ``model.safetensors.index.json``, or (older
folders) every ``*.safetensors`` file. Shapes and dtypes come from the file headers without reading
any tensor data; ``folder[name]`` reads that one tensor (``safetensors.safe_open`` memory-maps the
file, so only the pages of that tensor are touched). A converter that takes one name at a time
therefore never holds the whole checkpoint in host memory, let alone twice.

Problems with the folder are :class:`FolderError` (a ``ValueError``/``FileNotFoundError`` naming the
file and the fix), raised when the folder is opened, before any tensor is read. The folder is untrusted
data (:mod:`asyncrl.api.model_folder`): the index is a capped JSON file, every shard it names must be a
plain relative name that resolves to a regular file inside the folder (``../x`` and ``/x`` are refused,
as is a link out of it), and at most ``MAX_SHARDS`` files are opened.
"""

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model_bounds import show
from asyncrl.api.model_folder import MAX_SHARDS, FolderFileError, inside, read_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class FolderError(FileNotFoundError, ValueError):
    """A weights folder that cannot be read as a Hugging Face checkpoint; the message names the file and the fix."""


class HFFolder(Mapping[str, torch.Tensor]):
    """Lazy view of the tensors of a model folder (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.expanduser(str(directory)))
        self.source = str(self.path)
        if not self.path.is_dir():
            raise FolderError(
                f"no weights folder {self.source!r} (spec.model.weights); a pulled model's folder is what "
                "'asyncrl models pull smollm2' prints"
            )
        self._handles: dict[Path, Any] = {}
        self._files: dict[str, Path] = self._weight_map()
        self._shapes: dict[str, tuple[int, ...]] | None = None

    def _weight_map(self) -> dict[str, Path]:
        index = self.path / INDEX_FILE
        if os.path.lexists(index):
            return self._indexed(index)
        files = sorted(p.name for p in self.path.iterdir() if p.suffix == ".safetensors")
        if not files:
            raise FolderError(
                f"no {SINGLE_FILE} and no {INDEX_FILE} in {self.source}: save the model with "
                "save_pretrained(folder) (safetensors is its default format)"
            )
        if len(files) > MAX_SHARDS:
            raise FolderError(f"{self.source}: {len(files)} safetensors files, over MAX_SHARDS {MAX_SHARDS}; "
                              "re-save the folder with larger shards")
        out: dict[str, Path] = {}
        for file in (self._shard(f, str(self.path / f)) for f in files):
            for name in self._handle(file).keys():
                out[name] = file
        return out

    def _indexed(self, index: Path) -> dict[str, Path]:
        """The index's tensor name -> shard path, every shard confined to the folder (all problems at once)."""
        fix = "it needs a 'weight_map' of tensor name -> shard file: re-save the folder with save_pretrained"
        try:
            doc = read_json(self.path, INDEX_FILE, fix=fix)
        except FolderFileError as exc:
            raise FolderError(str(exc)) from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(type(k) is str for k in weight_map):
            raise FolderError(f"{index}: not a safetensors index (no 'weight_map' object); {fix}")
        if bad := [v for v in weight_map.values() if type(v) is not str][:1]:
            raise FolderError(f"{index}: weight_map value {show(bad[0])} is not a file name; {fix}")
        shards = sorted(set(weight_map.values()))
        if len(shards) > MAX_SHARDS:
            raise FolderError(f"{index} names {len(shards)} shard files, over MAX_SHARDS {MAX_SHARDS}; re-save the "
                              "folder with larger shards")
        paths, refused, missing = {}, [], []
        for shard in shards:
            try:
                paths[shard] = self._shard(shard, str(index))
            except FolderError as exc:
                refused.append(str(exc).removeprefix(f"{index}: "))
            except FileNotFoundError:
                missing.append(shard)
        if refused:
            raise FolderError(f"{index}: " + "; ".join(refused))
        if missing:
            raise FolderError(
                f"{index} names shard(s) {missing} that are not in {self.source}: copy the missing shard "
                "file(s) into the folder (or re-save it with save_pretrained)"
            )
        return {name: paths[f] for name, f in weight_map.items()}

    def _shard(self, name: str, where: str) -> Path:
        """The path of shard ``name`` once it is known to resolve to a regular file inside the folder (else
        :class:`FolderError`; a plain ``FileNotFoundError`` when absent). The folder's own name is kept:
        a hub cache snapshot's shards are links to blobs named by hash."""
        try:
            real = inside(self.path, name, where=where)
        except FolderFileError as exc:
            raise FolderError(str(exc)) from None
        if real is None:
            raise FileNotFoundError(name)
        return self.path / name

    def _handle(self, file: Path) -> Any:
        if file not in self._handles:
            from safetensors import safe_open

            try:
                self._handles[file] = safe_open(str(file), framework="pt")
            except Exception as exc:  # safetensors raises its own error types for a bad header
                raise FolderError(f"{file}: not a readable safetensors file ({exc}); re-copy or re-save it") from None
        return self._handles[file]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the headers (no tensor data read). An index entry whose shard
        lacks the tensor raises :class:`FolderError`."""
        if self._shapes is None:
            shapes, absent = {}, []
            for name, file in self._files.items():
                handle = self._handle(file)
                if name not in handle.keys():
                    absent.append(f"{name} (in {file.name})")
                    continue
                shapes[name] = tuple(handle.get_slice(name).get_shape())
            if absent:
                raise FolderError(
                    f"{self.path / INDEX_FILE} lists tensors its shards do not hold: {absent[:5]}; re-save the "
                    "folder with save_pretrained"
                )
            self._shapes = shapes
        return dict(self._shapes)

    def dtypes(self) -> dict[str, str]:
        """Every tensor's dtype as safetensors names it (``F32``, ``BF16``, ...)."""
        return {n: str(self._handle(f).get_slice(n).get_dtype()) for n, f in self._files.items()}

    def nbytes(self) -> int:
        """Bytes of all weight files of the folder."""
        return sum(p.stat().st_size for p in set(self._files.values()))

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            file = self._files[name]
        except KeyError:
            raise KeyError(f"{self.source}: no tensor {name!r}") from None
        return self._handle(file).get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def close(self) -> None:
        self._handles.clear()


def load_hf(directory: str) -> dict[str, torch.Tensor]:
    """All HF-named tensors of a folder, in memory (sharded or not; ``~`` expanded). For large models
    use :class:`HFFolder` with :func:`~asyncrl.trainer.megatron.convert.load_folder_into` instead."""
    folder = HFFolder(directory)
    out = dict(folder.items())
    folder.close()
    return out


def folder_problems(weights: str) -> list[str]:
    """Every problem of a model folder that would stop the actor or the rollout workers, found from
    ``config.json``, the safetensors headers and the file list (no tensor data read), each naming the
    file and the fix. Empty for a folder without ``config.json`` (a preset's bare weights: the actor's
    strict load checks those)."""
    from asyncrl.api.model_arch import ArchitectureError, arch_from_hf_config, folder_config, hf_param_shapes

    path = Path(os.path.expanduser(weights))
    if not path.is_dir():
        return [f"spec.model.weights {weights!r}: no such folder here; fix the path (or pull the model first)"]
    try:
        cfg = folder_config(weights)
        if cfg is None:
            return []
        arch = arch_from_hf_config(cfg, str(path / "config.json"))
    except ArchitectureError as exc:
        return [str(exc)]
    problems = []
    if not (path / "tokenizer.json").is_file():
        problems.append(
            f"{path}: no tokenizer.json; save the model's tokenizer into the folder "
            "(AutoTokenizer.from_pretrained(source).save_pretrained(folder))"
        )
    try:
        folder = HFFolder(path)
        shapes = folder.shapes()
    except FolderError as exc:
        return problems + [str(exc)]
    expected = hf_param_shapes(arch, with_tied_head=False)
    if arch.tie_embeddings:
        shapes.pop("lm_head.weight", None)
    missing = [k for k in expected if k not in shapes]
    unexpected = [k for k in shapes if k not in expected]
    wrong = [f"{k} {list(shapes[k])} in {folder._files[k].name} (config.json implies {list(s)})"
             for k, s in expected.items() if k in shapes and shapes[k] != s]
    if missing or unexpected or wrong:
        parts = ([f"missing {missing[:4]}{' ...' if len(missing) > 4 else ''} ({len(missing)})"] if missing else []) + (
            [f"unexpected {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''} ({len(unexpected)})"] if unexpected
            else []) + ([f"shape mismatch: {'; '.join(wrong[:4])}"] if wrong else [])
        problems.append(
            f"{path / 'config.json'} and the safetensors files disagree ({arch.architecture}): " + "; ".join(parts)
            + ". Fix config.json to match the weights, or re-save the folder with save_pretrained"
        )
    folder.close()
    return problems
