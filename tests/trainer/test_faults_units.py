"""The fault paths one piece at a time, on real files (real torch checkpoints, a real full file system):
verified checkpoints and the resume fallback, torn metrics lines, a full disk's own error and no
temporary files left behind. The end-to-end runs are in test_faults_e2e.py."""

import errno
import json
import logging
from pathlib import Path

import pytest
import torch

from asyncrl.trainer.checkpoint.folder import (
    CheckpointError,
    read_checkpoint,
    verify_checkpoint,
)
from asyncrl.trainer.driver.run import checkpoints, recovery
from asyncrl.trainer.driver.run.faults import describe
from asyncrl.trainer.driver.run.rundir import MetricsFileError, RunDir
from tests.support.filesystems import fill, small_filesystem
from tests.support.megatron_parts import write_checkpoint


def _save(root: Path, version: int, numel: int = 1 << 16) -> Path:
    """A real actor-shaped checkpoint at ``version`` plus its driver state, as the loop writes them."""
    recovery.save(root, recovery.DriverState(version, [version, version + 1], {"groups_admitted": 2 * version}))
    state = {"model": {"w": torch.arange(numel, dtype=torch.float32) + version}, "version": version}
    return write_checkpoint(checkpoints.path_for(root, version), state, {"version": version})


# ------------------------------------------------------------------------------ verified checkpoints

def test_a_checkpoint_records_its_files_and_every_kind_of_damage_is_named(tmp_path: Path) -> None:
    folder = _save(tmp_path, 2)
    meta = verify_checkpoint(folder)
    assert meta["files"]["actor.pt"]["bytes"] == (folder / "actor.pt").stat().st_size
    assert len(meta["files"]["actor.pt"]["sha256"]) == 64

    data = (folder / "actor.pt").read_bytes()
    (folder / "actor.pt").write_bytes(data[: len(data) // 2])  # truncated: a copy cut short
    with pytest.raises(CheckpointError, match=rf"actor.pt has {len(data) // 2} bytes, the marker records {len(data)}"):
        read_checkpoint(folder)  # before: torch's bare "PytorchStreamReader failed reading zip archive"

    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # same size, one byte changed
    (folder / "actor.pt").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="not the recorded SHA-256"):
        verify_checkpoint(folder)
    verify_checkpoint(folder, checksums=False)  # the cheap check (pruning) sees sizes only

    (folder / "actor.pt").write_bytes(data)
    (folder / "meta.json").write_text('{"version": 2, "fi')  # broken marker: before, a bare JSONDecodeError
    with pytest.raises(CheckpointError, match=r"meta.json is unreadable \(JSONDecodeError") as err:
        read_checkpoint(folder)
    assert str(folder) in str(err.value)


def test_resume_falls_back_to_the_newest_verified_checkpoint_and_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "checkpoints"
    for v in (2, 4, 6):
        _save(root, v)
    actor6 = checkpoints.path_for(root, 6) / "actor.pt"
    actor6.write_bytes(actor6.read_bytes()[:1000])  # truncated newest
    recovery.path_for(root, 4).write_text("{not json")  # checkpoint 4's driver state is broken
    with caplog.at_level(logging.WARNING):
        point = checkpoints.choose_resume(root)
    assert point.checkpoint is not None and point.checkpoint.version == 2
    assert point.state is not None and point.state.cursors == [2, 3]
    assert [s.checkpoint.version for s in point.skipped] == [6, 4]
    assert "actor.pt has 1000 bytes" in point.skipped[0].reason
    assert "driver-000004.json is unreadable" in point.skipped[1].reason
    notices = point.notices()
    assert "resuming from" in notices[-1] and "step-000002" in notices[-1] and "newest verified" in notices[-1]
    assert all(n in caplog.text for n in notices)  # the log says it too
    # set aside, kept for a look, never chosen again
    assert (root / "step-000006.corrupt").is_dir() and (root / "step-000004.corrupt").is_dir()
    assert [c.version for c in checkpoints.found(root)] == [2]
    assert checkpoints.choose_resume(root).skipped == []


def test_no_verified_checkpoint_starts_over_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save(root, 2)
    (checkpoints.path_for(root, 2) / "meta.json").unlink()
    point = checkpoints.choose_resume(root)
    assert point.checkpoint is None and "no meta.json" in point.skipped[0].reason
    assert "starts from the beginning" in point.notices()[-1]


def test_pruning_never_deletes_good_checkpoints_below_a_broken_newest(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for v in (2, 4, 6):
        _save(root, v)
    actor6 = checkpoints.path_for(root, 6) / "actor.pt"
    actor6.write_bytes(actor6.read_bytes()[:10])
    removed = checkpoints.prune(root, keep=1)
    # before: the broken 6 counted as the newest complete one and 2 and 4 were deleted
    assert removed == [checkpoints.path_for(root, 2)]
    assert checkpoints.latest(root) == checkpoints.Checkpoint(checkpoints.path_for(root, 4), 4)


# ------------------------------------------------------------------------------ metrics.jsonl

def _records(*steps: int) -> bytes:
    return b"".join(json.dumps({"step": s, "version": s}).encode() + b"\n" for s in steps)


def test_a_torn_last_line_is_cut_off_and_said(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path)
    run.metrics_jsonl.write_bytes(_records(1, 2, 3) + b'{"step": 4, "reward_me')  # killed mid-write
    notices: list[str] = []
    kept = run.keep_steps_up_to(2, notices)  # resume from a checkpoint at 2
    assert [r["step"] for r in kept] == [1, 2]
    assert run.metrics_jsonl.read_bytes() == _records(1, 2)
    assert len(notices) == 1 and "line 4 was torn" in notices[0] and str(run.metrics_jsonl) in notices[0]
    # a whole record that only lacks its newline is kept
    run.metrics_jsonl.write_bytes(_records(1, 2)[:-1])
    assert [r["step"] for r in run.read_steps()] == [1, 2] and run.metrics_jsonl.read_bytes() == _records(1, 2)


def test_a_torn_middle_line_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path)
    original = _records(1) + b'{"step": 2, "rew\n' + _records(3)
    run.metrics_jsonl.write_bytes(original)
    with pytest.raises(MetricsFileError, match=rf"{run.metrics_jsonl}:2: not a JSON record"):
        run.keep_steps_up_to(3)
    assert run.metrics_jsonl.read_bytes() == original  # nothing repaired behind the user's back


# ------------------------------------------------------------------------------ a full disk

def test_a_full_disk_names_its_error_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "fs", size_mib=4) as fs:
        root = fs / "checkpoints"
        _save(root, 2, numel=1 << 10)  # fits
        filler = fill(fs, leave_bytes=64 << 10)
        with pytest.raises(OSError) as err:
            _save(root, 4, numel=1 << 18)  # 1 MiB of weights: ENOSPC, for real
        assert err.value.errno == errno.ENOSPC
        said = describe(err.value)
        assert said.startswith("OSError: ENOSPC (errno 28): No space left on device") and "bytes free" in said, said
        left = sorted(p.name for p in root.iterdir())
        # the good checkpoint stays; nothing half-written: no .step-000004.tmp-PID, no driver-000004.json.tmp
        assert left in (["driver-000002.json", "step-000002"],
                         ["driver-000002.json", "driver-000004.json", "step-000002"]), left
        run = RunDir.create(fs / "run")
        with pytest.raises(OSError):
            run.write_summary({"job": "x", "blob": "y" * (1 << 20)})
        assert not (fs / "run" / "summary.json.tmp").exists()
        filler.unlink()
        # what a killed process leaves is swept when the next run starts
        (fs / "run" / "summary.json.tmp").write_text("{")
        (fs / "run" / ".warm_start.tmp-4242").mkdir()
        (root / ".step-000006.tmp-4242").mkdir()
        (root / "driver-000006.json.tmp").write_text("{")
        assert len(run.sweep_temporaries()) == 2 and len(checkpoints.sweep_temporaries(root)) == 2
        assert sorted(p.name for p in (fs / "run").iterdir()) == []
        assert checkpoints.choose_resume(root).checkpoint.version == 2  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ driver --local without GPUs

def test_driver_local_refuses_gpus_this_machine_lacks_with_the_fix(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.api.validation import quickstart_doc, validate_job
    from asyncrl.trainer.cli import main
    from asyncrl.trainer.cli.cluster import local_gpu_problem

    job = validate_job(quickstart_doc(), "quickstart.yaml")
    assert job.spec.actor.gpus_per_replica == 1  # the default: a GPU per actor pod
    said = local_gpu_problem(job.spec, gpus_here=0)
    assert said is not None and "spec.actor.gpusPerReplica: 1" in said and "gpusPerReplica: 0" in said
    assert local_gpu_problem(job.spec, gpus_here=1) is None
    if torch.cuda.device_count() == 0:  # this machine: the CLI refuses before Ray starts (before: waited forever)
        spec = tmp_path / "job.yaml"
        spec.write_text(json.dumps(quickstart_doc()))
        assert main(["driver", "--spec", str(spec), "--local", "--run-dir", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert "asyncrl driver --local: spec.actor.gpusPerReplica: 1" in err and "0 GPU(s)" in err, err
        assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ session folders of killed runs

def test_session_folders_of_killed_runs_are_swept_and_live_or_new_ones_kept(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import time

    from asyncrl.trainer.driver.hosts.ray_env import sweep_stale_sessions

    old, new, busy = (tmp_path / f"asyncrl-ray-{n}" for n in ("old", "new", "busy"))
    for d in (old, new, busy):
        (d / "r").mkdir(parents=True)
    hour_ago = time.time() - 3600
    for d in (old, busy):
        os.utime(d, (hour_ago, hour_ago))
    # a live process that names its folder, as Ray's gcs_server and raylet do (--session-dir=...)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--session-dir={busy}/r"])
    try:
        assert sweep_stale_sessions(tmp_path) == [old]
    finally:
        holder.kill()
        holder.wait()
    assert not old.exists() and new.is_dir() and busy.is_dir()
