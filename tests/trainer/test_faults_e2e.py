"""Faults that used to lose work or hide their cause, end to end: ``asyncrl run`` as a user runs it (its
console, its exit code), on the tiniest job, with real damage -- a truncated checkpoint, a torn and a broken
metrics line, a full tmpfs, SIGTERM mid-run.

SIGTERM needs the command in a process of its own (and its own Ray, whose processes must not outlive it). The
damage tests run the same command in this process (``asyncrl.trainer.cli.main``, its console and exit code
captured from the file descriptors) on the session's shared Ray: what they check happens in the driver, and a
process and a Ray start per run would only add their cost."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.filesystems import fill, small_filesystem

pytestmark = pytest.mark.slow  # each test runs `asyncrl run` two or three times (15-60 s each on 2 cores)


def _job(tmp_path: Path, steps: int, every: int) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "faults"},
        "spec": {
            "async": {"maxStaleness": 1},
            "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 16},
            "train": {"steps": steps, "promptsPerStep": 2, "warmStartSteps": 0},
            "rollout": {"replicas": 1},
            "checkpoint": {"everySteps": every},
            "monitoring": {"enabled": False},
        },
    }
    path = tmp_path / f"job-{steps}-{every}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _cmd(job: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asyncrl.trainer.cli", "run", str(job), "--run-dir", str(run_dir), "--quiet", *extra]


def _run(job: Path, run_dir: Path, *extra: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(_cmd(job, run_dir, *extra), env=env, capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


def _run_here(capfd: pytest.CaptureFixture[str], job: Path, run_dir: Path, *extra: str) -> tuple[int, str]:
    """``asyncrl run`` in this process, on the shared Ray (the command reuses a Ray that is already up)."""
    from asyncrl.trainer.cli import main

    capfd.readouterr()
    code = main(["run", str(job), "--run-dir", str(run_dir), "--quiet", *extra])
    out = capfd.readouterr()
    return code, out.out + out.err


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _summary(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def _temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if re.search(r"\.tmp(-\d+)?$|\.old-\d+$", p.name))


def test_a_truncated_checkpoint_and_a_torn_log_line_resume_from_the_last_good_one(
        ray_session: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    job = _job(tmp_path, steps=4, every=2)
    code, out = _run_here(capfd, job, run_dir)
    assert code == 0, out[-4000:]
    ckpts = run_dir / "checkpoints"
    good_cursors = json.loads((ckpts / "driver-000002.json").read_text())["cursors"]
    # the damage: the newest checkpoint cut short (a copy or a disk that lost its tail), and a record torn
    # by a kill mid-write
    actor = ckpts / "step-000004" / "__0_0.distcp"  # rank 0's shards of the sharded folder
    actor.write_bytes(actor.read_bytes()[: actor.stat().st_size // 3])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "reward_mean": 0.')

    code, out = _run_here(capfd, job, run_dir, "--steps", "6")
    # before: "PytorchStreamReader failed reading zip archive" on every resume, no path named
    assert code == 0, out[-4000:]
    assert f"checkpoint {ckpts / 'step-000004'} skipped: __0_0.distcp has" in out, out[-4000:]
    assert f"resuming from {ckpts / 'step-000002'} (version 2), the newest verified checkpoint" in out
    assert "line 5 was torn" in out and str(run_dir / "metrics.jsonl") in out
    s = _summary(run_dir)
    assert s["status"] == "succeeded" and s["start_version"] == 2 and s["final_version"] == 6, s
    assert s["resumed_from"] == str(ckpts / "step-000002")
    assert any("skipped" in n for n in s["notices"]) and any("torn" in n for n in s["notices"])
    # only what came after the last good checkpoint was redone: each step logged once, in order
    assert _steps(run_dir) == [1, 2, 3, 4, 5, 6]
    # the resume's cursors are those of the checkpoint it resumed (before: the end-of-run cursors, an alias)
    assert s["resume"]["cursors"] == good_cursors
    assert (ckpts / "step-000004.corrupt").is_dir() and (ckpts / "step-000006" / "meta.json").is_file()

    # a damaged record in the middle is refused, naming file and line; what the good run wrote stays
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    summary_before, report_before = (run_dir / "summary.json").read_bytes(), (run_dir / "report.png").read_bytes()
    code, out = _run_here(capfd, job, run_dir, "--steps", "8")
    assert code == 1
    assert f"{run_dir / 'metrics.jsonl'}:3: not a JSON record" in out, out[-4000:]
    # before: summary.json became "failed after 0 steps" and report.png a blank plot
    assert (run_dir / "summary.json").read_bytes() == summary_before
    assert (run_dir / "report.png").read_bytes() == report_before
    attempt = json.loads((run_dir / "last-attempt.json").read_text())
    assert attempt["status"] == "failed" and "metrics.jsonl:3" in attempt["error"]


def test_a_full_disk_names_its_error_and_leaves_nothing_temporary(
        ray_session: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = _job(tmp_path, steps=4, every=2)
    with small_filesystem(tmp_path / "fs", size_mib=32) as fs:  # the default reset rule (recentre) checkpoints W bf16 residuals too
        run_dir = fs / "run"
        filler = fill(fs, leave_bytes=2 << 20)  # the log fits, the checkpoint at step 2 does not
        code, out = _run_here(capfd, job, run_dir)
        assert code == 1, out[-4000:]
        # before: "failed after 0 steps in 0.0 s ... run directory: None", the ENOSPC replaced by the summary's
        assert "run directory: None" not in out
        said = next(line for line in out.splitlines() if "error:" in line)
        assert "ENOSPC (errno 28): No space left on device" in said, out[-4000:]
        assert str(run_dir / "checkpoints" / "step-000002") in said and "bytes free" in said, said
        assert _temporaries(fs) == []  # before: .step-000002.tmp-PID/ and summary.json.tmp stayed
        s = json.loads((run_dir / "summary.json").read_text())
        assert s["status"] == "failed" and "ENOSPC" in s["error"]
        filler.unlink()
        code, out = _run_here(capfd, job, run_dir)  # space again: the rerun works and leaves nothing temporary either
        assert code == 0, out[-4000:]
        assert _temporaries(fs) == [] and _summary(run_dir)["final_version"] == 4
        shutil.rmtree(run_dir)  # before the unmount


def _session_processes(sid: int) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out[int(d.name)] = cmd
    return out


def test_sigterm_mid_run_checkpoints_exits_0_and_the_rerun_continues(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = _job(tmp_path, steps=200, every=1000)  # no periodic checkpoint: only the one SIGTERM writes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(_cmd(job, run_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its Ray's processes share its session id
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            seen.update(_session_processes(proc.pid))
            if (run_dir / "metrics.jsonl").exists() and len(_steps(run_dir)) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        proc.send_signal(signal.SIGTERM)  # mid-run: the step in progress, rollout calls in flight
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # before: exit 134 with a Ray dump, no summary, no final checkpoint
    assert proc.returncode == 0, out[-4000:]
    s = _summary(run_dir)
    version = s["final_version"]
    assert s["status"] == "preempted" and 2 <= version < 200, s
    assert s["final_checkpoint"] == str(run_dir / "checkpoints" / f"step-{version:06d}")
    assert (run_dir / "checkpoints" / f"step-{version:06d}" / "meta.json").is_file()
    assert "stopped by SIGTERM" in out and _steps(run_dir) == list(range(1, version + 1))
    # nothing of its Ray outlives it: no process of its session, no session folder
    assert _session_processes(proc.pid) == {}
    folders = {m for cmd in seen.values() for m in re.findall(r"/[^ ]*?asyncrl-ray-[^/ ]+", cmd)}
    assert folders and not any(Path(f).exists() for f in folders), (folders, sorted(set(seen.values()))[:5])

    code, out = _run(job, run_dir, "--steps", str(version + 2))
    assert code == 0, out[-4000:]
    s = _summary(run_dir)
    assert s["start_version"] == version and s["final_version"] == version + 2, s
    assert _steps(run_dir) == list(range(1, version + 3))
