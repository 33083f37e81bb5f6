"""``asyncrl export PATH``: which checkpoint a run directory (or a checkpoint folder) means, and its
export as a Hugging Face model folder.

    resolve   a run directory -> its newest complete checkpoint (``checkpoint.dir`` of its job.yaml);
              a checkpoint root -> its newest complete one; a checkpoint folder -> itself, and the
              job.yaml of the run it belongs to
    export    :mod:`asyncrl.trainer.export` loads its weights and writes the folder

Resolving reads the run's checkpoint folders the way resuming does (:mod:`.checkpoints`), so it lives
with the driver; :mod:`asyncrl.trainer.export` (what the driver itself calls during training) does not
import the driver.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

from asyncrl.api.job import AsyncRLJob
from asyncrl.trainer.checkpoint.folder import META_FILE, CheckpointError, verify_checkpoint
from asyncrl.trainer.driver.run import checkpoints
from asyncrl.trainer.export import (
    DEFAULT_MAX_SHARD_BYTES,
    ExportDtype,
    ExportError,
    ExportResult,
    checkpoint_weights,
    model_files,
    write_hf_folder,
)
from asyncrl.trainer.export_lora import export_lora_checkpoint


def find_job_file(path: Path) -> Path | None:
    """The ``job.yaml`` of the run ``path`` (a run directory or a checkpoint inside one) belongs to."""
    for folder in [path, *list(path.parents)[:3]]:
        if (folder / "job.yaml").is_file():
            return folder / "job.yaml"
    return None


def load_job(job_file: Path) -> AsyncRLJob:
    from asyncrl.api.validation import load_jobs

    jobs = load_jobs(str(job_file))
    if len(jobs) != 1:
        raise ExportError(f"{job_file}: must hold one AsyncRLJob, found {len(jobs)}")
    return jobs[0]


@dataclass(frozen=True)
class Resolved:
    """What ``asyncrl export PATH`` exports: a verified checkpoint folder, its job, and the newer folders
    passed over (each with the reason it does not verify)."""

    checkpoint: Path
    job: AsyncRLJob
    skipped: list[str] = field(default_factory=list)


def resolve_checkpoint(path: Path, job: AsyncRLJob | None) -> Resolved:
    """The checkpoint of ``path``: a checkpoint folder (holds ``actor.pt``), a run directory (its newest
    verified checkpoint under the job's ``checkpoint.dir``) or a checkpoint root (its newest verified).

    ``job`` (``--job``) overrides the run's own ``job.yaml``.
    """
    path = path.expanduser()
    if not path.exists():
        raise ExportError(f"{path}: no such run directory or checkpoint")
    if job is None:
        job_file = find_job_file(path)
        if job_file is None:
            raise ExportError(
                f"{path}: no job.yaml in it or in the run directory above it; pass the job the checkpoint was "
                "trained with: asyncrl export CHECKPOINT --job JOB.yaml --out DIR"
            )
        job = load_job(job_file)
    if (path / META_FILE).is_file():  # a checkpoint folder (sharded, or the former single actor.pt)
        return Resolved(path, job)
    configured = Path(job.spec.checkpoint.dir)  # relative: inside the run directory (a cluster: its volume)
    roots = [path, configured if configured.is_absolute() else path / configured]
    for root in roots:
        newest = checkpoints.latest(root)  # the newest whose files verify (sizes and checksums recorded)
        if newest is None:
            continue
        skipped = []
        for c in checkpoints.found(root):
            if c.version > newest.version:
                try:
                    verify_checkpoint(c.path)
                except CheckpointError as exc:
                    skipped.append(f"{c.path} skipped: {exc.reason}")
        return Resolved(newest.path, job, skipped)
    raise ExportError(
        f"{path}: no complete checkpoint (a step-NNNNNN folder with meta.json) in {', '.join(map(str, roots))}; "
        "train longer than checkpoint.everySteps, or pass a checkpoint folder"
    )



def export_checkpoint(path: Path, out: Path, *, job: AsyncRLJob | None = None, dtype: ExportDtype = "float32",
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, overwrite: bool = False,
                      progress: bool = False, merged: bool = False) -> ExportResult:
    """``asyncrl export``: the newest complete checkpoint of a run directory (or a checkpoint) -> ``out``.

    A LoRA run (``spec.model.lora``) exports a peft adapter folder, or with ``merged`` the full HF folder
    (:mod:`asyncrl.trainer.export_lora`); ``merged`` changes nothing for a full fine-tuning run."""
    resolved = resolve_checkpoint(path, job)
    files = model_files(resolved.job.spec)
    if resolved.job.spec.model.lora is not None:
        result = export_lora_checkpoint(
            resolved.checkpoint, resolved.job.spec, files, out, merged=merged, overwrite=overwrite,
            provenance={"job": resolved.job.metadata.name, "checkpoint": str(resolved.checkpoint),
                        "skipped": resolved.skipped},
            dtype=dtype, max_shard_bytes=max_shard_bytes, progress=progress)
        return replace(result, skipped=resolved.skipped)
    hf, version = checkpoint_weights(resolved.checkpoint, files)
    result = write_hf_folder(hf, files, out, version=version, dtype=dtype, max_shard_bytes=max_shard_bytes,
                             overwrite=overwrite, progress=progress,
                             provenance={"job": resolved.job.metadata.name, "checkpoint": str(resolved.checkpoint),
                                         "skipped": resolved.skipped})
    return replace(result, skipped=resolved.skipped)
