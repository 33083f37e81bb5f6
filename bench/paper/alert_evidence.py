"""Evidence that the shipped EWMA reset alert fires during a run that resets, and not for a healthy one.

Usage::

    .venv/bin/python bench/paper/alert_evidence.py [--seed 0] [--out runs/paper/alerts]

Two real ``asyncrl run`` jobs of the EWMA experiment (``docs/results.md`` section 2), the first :data:`STEPS`
versions and no held-out evaluation, each serving its own ``/metrics``: ``resets`` (decay 0.9 with the paper's
reset rule in the stress block, 8 updates of 1e-3 per version: its seed-0 record resets at version 4) and
``healthy`` (the staleness-aware decay with the same rule, at 4 updates of 1e-4 per version,
:data:`HEALTHY_SCALE`, where the policy moves slowly enough that the in-bounds ratio stays above tau). A real
Prometheus (the Debian package, loopback, 1 s scrape and evaluation) scrapes both with the chart's rules as helm
renders them (``prometheusRule.enabled=true``, nothing else changed: AsyncRLEwmaReset is ``for: 0m`` over
``increase(asyncrl_ewma_resets_total{reason!="manual"}[5m])``), the targets labelled
``namespace``/``asyncrljob``/``role`` as the chart's PodMonitor relabels them. Every second the script reads
``/api/v1/alerts`` and each job's ``asyncrl_policy_version``; when both jobs have ended it writes
``docs/results/data/alerts/evidence.json``: every alert seen firing (name, labels, Prometheus's ``activeAt``,
the job's version when first seen), and each job's own resets (versions and seconds since its start, from
its ``metrics.jsonl``). :func:`section` renders that record.
"""

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
import render as rd  # noqa: E402

NAMESPACE = "paper"
ALERT = "AsyncRLEwmaReset"
RECORD = h.ROOT / "docs" / "results" / "data" / "alerts" / "evidence.json"
STEPS = 20  # the stress block's resets come early (decay 0.9 at lr 1e-3: versions 4, 7, 10, ... at seed 0)
SCALE = replace(h.FULL, steps=STEPS, eval_every=0)
# The healthy job moves the policy half as far per version as the base scale (4 updates of 1e-4), where the
# in-bounds ratio of the staleness-aware decay stays above tau in the first 20 versions. Before 22e935d a job
# that loaded a cached warm start trained at the cache's rate (3e-4 then), whatever its spec said.
HEALTHY_SCALE = replace(SCALE, minibatches=4, learning_rate=1e-4)
ROLES = {"resets": ("lr 0.001: decay 0.9, reset", SCALE), "healthy": ("decay auto, reset", HEALTHY_SCALE)}


def jobs() -> dict[str, h.Config]:
    import ewma

    return {role: ewma.cfg(name) for role, (name, _) in ROLES.items()}


def job_doc(name: str, cfg: h.Config, scale: h.Scale, seed: int, port: int) -> dict[str, Any]:
    """The experiment's job with monitoring on (the same correction and seed as its record)."""
    doc = h.job_doc(cfg, scale, seed)
    doc["metadata"]["name"] = name
    doc["spec"]["monitoring"] = {"enabled": True, "port": port}
    if scale.eval_every == 0:
        del doc["spec"]["eval"]  # no held-out evaluation: the spec refuses its other fields without everySteps
    return doc


def find_helm() -> str:
    for candidate in (h.ROOT / ".tools" / "helm" / "helm", shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            out = subprocess.run([str(candidate), "version", "--short"], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.startswith("v3."):
                return str(candidate)
    raise SystemExit("helm v3 not found in .tools/helm/helm or on PATH; run `make tools`")


def chart_rules() -> list[dict[str, Any]]:
    """``spec.groups`` of the chart's PrometheusRule as helm renders it with the shipped values."""
    out = subprocess.run([find_helm(), "template", "rel", str(h.ROOT / "charts" / "asyncrl"), "-n", "ops",
                          "--set", "prometheusRule.enabled=true"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"helm template failed: {out.stderr.strip()}")
    (rule,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PrometheusRule"]
    return list(rule["spec"]["groups"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus {path}: {body}")
    return body["data"]


def own_resets(run_dir: Path) -> list[dict[str, Any]]:
    """The job's resets from its own metrics.jsonl: version and seconds since the run's start."""
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [{"version": int(r["version"]), "wall_s": round(float(r["wall_s"]), 1), "reason": r.get("ewma_reset_reason")}
            for r in lines if r.get("ewma_reset")]


def own_outcomes(run_dir: Path) -> list[dict[str, Any]]:
    """The reset outcomes decided during the job (metrics.jsonl): version and outcome."""
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [{"version": int(r["version"]), "outcome": r["ewma_reset_outcome"]} for r in lines if r.get("ewma_reset_outcome")]


Role = tuple[str, h.Scale, h.Config]  # (cell label, scale, configuration) of one job


def default_roles() -> dict[str, Role]:
    return {role: (label, scale, cfg) for (role, (label, scale)), cfg in zip(ROLES.items(), jobs().values(), strict=True)}


def collect(out: Path, *, seed: int = 0, warm_start: Path | None = None,
            timeout_s: float = 1800.0, log: Any = print, roles: Mapping[str, Role] | None = None) -> dict[str, Any]:
    """Run the jobs (``roles``, default :data:`ROLES`) under a real Prometheus and return the evidence record
    (see the module docstring)."""
    roles = dict(roles or default_roles())
    cfgs = {n: r[2] for n, r in roles.items()}
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus not found; run `make tools` (Debian package prometheus)")
    asyncrl = Path(sys.executable).with_name("asyncrl")
    out = out.resolve()  # the jobs run with cwd=out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "rules.yaml").write_text(yaml.safe_dump({"groups": chart_rules()}))
    ports = {name: free_port() for name in cfgs}
    prom_port = free_port()
    (out / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(out / "rules.yaml")],
        "scrape_configs": [{"job_name": "asyncrl-jobs", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"namespace": NAMESPACE, "asyncrljob": n, "role": "driver"}}
            for n in cfgs]}],
    }))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    started: dict[str, float] = {}
    t0 = time.time()
    versions: dict[str, float] = {}

    def note(alerts: list[dict[str, Any]], versions: Mapping[str, float]) -> None:
        """Keep the first sighting of every firing (alert, job, reason)."""
        for a in alerts:
            labels = a["labels"]
            key = (labels["alertname"], labels.get("asyncrljob", ""), labels.get("reason", ""))
            if a["state"] == "firing" and key not in seen:
                job = labels.get("asyncrljob", "")
                seen[key] = {"alert": labels["alertname"], "labels": dict(sorted(labels.items())),
                             "active_at_s": round(_epoch(a["activeAt"]) - started.get(job, t0), 1),
                             "seen_at_version": int(versions.get(job, -1)), "value": a.get("value")}
                log(f"  firing: {labels['alertname']} job={job} at version {versions.get(job)}")

    try:
        procs["prometheus"] = subprocess.Popen(
            [prometheus, f"--config.file={out / 'prometheus.yml'}", f"--storage.tsdb.path={out / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=(out / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
        for name, cfg in cfgs.items():
            rdir = out / f"run-{name}"
            if warm_start is not None:  # the experiments' shared warm start (else each job makes its own)
                shutil.copytree(warm_start, rdir / "warm_start")
            (out / f"{name}.yaml").write_text(yaml.safe_dump(job_doc(name, cfg, roles[name][1], seed, ports[name])))
            started[name] = time.time()
            procs[name] = subprocess.Popen([str(asyncrl), "run", str(out / f"{name}.yaml"), "--run-dir", str(rdir),
                                            "--quiet"], stdout=(out / f"{name}.log").open("wb"),
                                           stderr=subprocess.STDOUT, cwd=out)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(1.0)  # Prometheus evaluates every second; this only samples its answers
            try:
                alerts = api(prom_port, "alerts")["alerts"]
                versions = {r["metric"]["asyncrljob"]: float(r["value"][1])
                            for r in api(prom_port, "query", query="asyncrl_policy_version")["result"]}
            except OSError:  # Prometheus still starting
                continue
            note(alerts, versions)
            if all(procs[n].poll() is not None for n in cfgs):
                time.sleep(3.0)  # one more scrape and evaluation of the final counters
                note(api(prom_port, "alerts")["alerts"], versions)
                break
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    failed = {n: procs[n].returncode for n in cfgs if procs[n].returncode != 0}
    if failed:
        tails = "\n".join(f"--- {n}\n{(out / f'{n}.log').read_text()[-1500:]}" for n in failed)
        raise SystemExit(f"jobs {failed} did not succeed (exit codes); no evidence written\n{tails}")
    return {
        "schema": 1, "seed": seed, "steps": max(r[1].steps for r in roles.values()), "namespace": NAMESPACE,
        "rules": "charts/asyncrl PrometheusRule (helm template, prometheusRule.enabled=true, shipped values)",
        "jobs": {n: {"cell": roles[n][0], "config": c.spec(), "scale": h.scale_record(roles[n][1]),
                     "exit_code": procs[n].returncode,
                     "own_resets": own_resets(out / f"run-{n}"),
                     "own_outcomes": own_outcomes(out / f"run-{n}")} for n, c in cfgs.items()},
        "firing": sorted(seen.values(), key=lambda r: (r["alert"], r["labels"].get("asyncrljob", ""))),
        "wall_s": round(time.time() - t0, 1),
    }


def _epoch(stamp: str) -> float:
    """Prometheus's RFC 3339 ``activeAt`` (nanoseconds, ``Z``) as seconds since the epoch."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + (float("0." + frac) if frac else 0.0)


def section(folder: Path) -> str:
    path = folder / "evidence.json"
    if not path.exists():
        return "No records yet (`docs/results/data/alerts/evidence.json`: run `bench/paper/alert_evidence.py`).\n"
    ev = json.loads(path.read_text())
    rows = []
    for name, j in ev["jobs"].items():
        mine = [f for f in ev["firing"] if f["labels"].get("asyncrljob") == name]
        resets = ", ".join(f"v{r['version']} at {r['wall_s']:.0f} s" for r in j["own_resets"]) or "none"
        fired = "; ".join(f"**{f['alert']}** (severity {f['labels'].get('severity')}, reason "
                          f"{f['labels'].get('reason', '-')}), active (Prometheus `activeAt`) {f['active_at_s']:.0f} s "
                          f"after the job's process started (start-up, warm-start load and probe included), "
                          f"seen at version {f['seen_at_version']}" for f in mine) or "**none**"
        sc = j["scale"]
        lr = j["config"].get("learning_rate", sc["learning_rate"])  # a cell's own rate overrides the scale's
        rows.append([f"`{name}`", f"{j['cell']}: {_describe(j['config'])}; {sc['minibatches']} x {lr:g}",
                     str(j["exit_code"]), resets, fired])
    fired_for = {f["labels"].get("asyncrljob") for f in ev["firing"] if f["alert"] == ALERT}
    reset_jobs = {n for n, j in ev["jobs"].items() if j["own_resets"]}
    agree = fired_for == reset_jobs
    return "\n".join([
        f"`bench/paper/alert_evidence.py` (seed {ev['seed']}, {ev['steps']} versions, no held-out evaluation; "
        f"{ev['wall_s']:.0f} s): two real "
        "`asyncrl run` jobs, each serving its own `/metrics`, scraped every second by a real Prometheus that evaluates "
        f"the {ev['rules']}; targets labelled `namespace={ev['namespace']}`, `asyncrljob=<job>`, `role=driver` as the "
        "PodMonitor relabels them. Every alert seen firing while the jobs ran:", "",
        rd.markdown_table(["job", "cell: correction; updates x learning rate per version", "exit", "its own resets (metrics.jsonl: version, seconds)",
                           "alerts firing for this job"], rows),
        f"{ALERT} fired for exactly the jobs whose reference reset: "
        f"{'yes' if agree else 'NO'} (fired for {sorted(fired_for) or 'none'}, reset: {sorted(reset_jobs) or 'none'}). "
        "The slow test `tests/monitoring/test_reset_alert_e2e.py` repeats this and asserts it.", ""])


def _describe(cfg: Mapping[str, Any]) -> str:
    c = cfg["correction"]
    ew = c.get("ewma", {})
    reset = ew.get("reset", {})
    return (f"{c['reference']}, decay {ew.get('decay', 'auto')}, reset {'on' if reset.get('enabled', True) else 'off'} "
            f"(tau {reset.get('keepRatioBelow')}, k {reset.get('consecutiveSteps')}), W {cfg['max_staleness']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/paper/alerts"))
    p.add_argument("--warm-start", type=Path, default=h.warm_dir(Path("runs/paper/full"), h.FULL),
                   help="the experiments' warm start folder (made by the first experiment run)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated script still stops its jobs (finally)
    ev = collect(args.out, seed=args.seed, warm_start=args.warm_start if args.warm_start.exists() else None)
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(ev, indent=1, sort_keys=True) + "\n")
    print(section(RECORD.parent))
    print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
