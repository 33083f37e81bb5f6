"""Paths a job names: where they may point, and whether a model folder is there.

- ``spec.checkpoint.dir`` stays inside what the job owns: a relative folder inside the run directory
  (locally) or the job's checkpoint volume (in a cluster), or an absolute folder inside that volume's
  mount, :data:`~asyncrl.api.constants.CHECKPOINT_MOUNT`. A ``..`` segment is refused wherever it is
  (``a/../../x`` would leave the run directory after normalisation); the model and the CRD's CEL rule
  say the same, with the same words.
- ``spec.model.weights`` is a folder with ``config.json`` (or, with a preset, bare ``*.safetensors``):
  :func:`weights_problem` checks it on this machine before any process starts (``asyncrl run``,
  ``asyncrl driver`` for a mounted folder; ``asyncrl validate`` warns, or refuses with ``--local``).
  Deeper checks of a model folder (its family, its shards) belong to :mod:`asyncrl.api.model_arch`.
"""

import posixpath
from pathlib import Path

from asyncrl.api.cel import CelRule
from asyncrl.api.constants import CHECKPOINT_MOUNT

MAX_PATH_LENGTH = 4096  # PATH_MAX; also bounds the CEL rule's cost on the API server
CHECKPOINT_DIR_MESSAGE = (
    "checkpoint.dir must stay inside what the job owns: a relative folder inside the run directory (locally) or "
    f"the job's checkpoint volume (in a cluster), e.g. checkpoints, or an absolute folder under {CHECKPOINT_MOUNT}/ "
    f"(the volume's mount, e.g. {CHECKPOINT_MOUNT}/my-job); no '..' segments"
)
CHECKPOINT_DIR_RULE = CelRule(
    "!self.matches('(^|/)[.][.](/|$)') && "
    f"(!self.startsWith('/') || self == '{CHECKPOINT_MOUNT}' || self.startsWith('{CHECKPOINT_MOUNT}/'))",
    CHECKPOINT_DIR_MESSAGE,
)


def checkpoint_dir_problem(value: str) -> str | None:
    """Why ``value`` may not be ``spec.checkpoint.dir`` (None: it may); the same rule as
    :data:`CHECKPOINT_DIR_RULE`."""
    if ".." in value.split("/"):
        where = posixpath.normpath(value)
        return f"{CHECKPOINT_DIR_MESSAGE} (got {value!r}, which normalises to {where!r})"
    if value.startswith("/") and not (value == CHECKPOINT_MOUNT or value.startswith(CHECKPOINT_MOUNT + "/")):
        return f"{CHECKPOINT_DIR_MESSAGE} (got the absolute path {value!r})"
    return None


WEIGHTS_CONFIG = "config.json"  # what makes a folder a model folder (Hugging Face save_pretrained)
WEIGHTS_FIX = (
    "give the folder that save_pretrained wrote, or the one 'asyncrl models pull NAME' prints "
    "(e.g. asyncrl models pull smollm2)"
)


def weights_problem(weights: str) -> str | None:
    """Why ``spec.model.weights`` is not a model folder on this machine (None: it is one), naming the file
    looked for. ``~`` is expanded (pulled models live in a user cache)."""
    folder = Path(weights).expanduser()
    config = folder / WEIGHTS_CONFIG
    if not folder.exists():
        return f"{weights!r}: no such folder here (looked for {config}); {WEIGHTS_FIX}"
    if not folder.is_dir():
        return f"{weights!r} is a file, not a model folder (looked for {config}); {WEIGHTS_FIX}"
    if not config.is_file() and not any(folder.glob("*.safetensors")):
        # (a folder of bare safetensors with a preset is still a model folder, as before config.json was read)
        return (f"{weights!r} is not a model folder: it has no {WEIGHTS_CONFIG} (looked for {config}) and no "
                f"*.safetensors; {WEIGHTS_FIX}")
    return None
