"""Render the dashboard's panels from real data into ``docs/dashboard.png`` (matplotlib).

A short real ``asyncrl run`` serves its ``/metrics``; a real Prometheus on loopback scrapes it
every second with the target labels the PodMonitor's relabelling gives in a cluster
(``namespace``, ``asyncrljob``, ``role``); when the run ends, every panel query of
``monitoring/dashboard.py`` is evaluated over the run through Prometheus' HTTP API and drawn as
Grafana would (time series, stat, heatmap). Operator panels stay empty here: no operator runs.

Usage (from the repository root; about 5-10 minutes on a laptop-class CPU)::

    python monitoring/render.py [--steps 12] [--warm-start-steps 60] [--output docs/dashboard.png]

The job is the embedded quickstart (``api/examples/quickstart.yaml``) with fewer steps and a
shorter supervised warm start, so that the run takes minutes.
"""

import argparse
import json
import math
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the generator is monitoring.dashboard
    sys.path.insert(0, str(ROOT))

from monitoring.dashboard import ROWS, PanelDef, substitute  # noqa: E402

NAMESPACE, JOB = "docs", "quickstart"
SCRAPE_SECONDS = 1
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval is at least 4 scrape intervals


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, params: dict[str, str]) -> Any:
    with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode(params)}", timeout=30) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"{url} {params}: {body}")
    return body["data"]


def _wait_ready(prom: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{prom}/-/ready", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"prometheus at {prom} not ready after {timeout:.0f} s")


def collect(steps: int, warm_start_steps: int, prometheus: str, workdir: Path) -> tuple[dict[str, list[list[dict[str, Any]]]], float, float]:
    """Run the job under a scraping Prometheus; return each panel's query results (range vectors)."""
    metrics_port, prom_port = _free_port(), _free_port()
    job = yaml.safe_load((ROOT / "api" / "examples" / "quickstart.yaml").read_text())
    job["spec"]["train"].update(steps=steps, warmStartSteps=warm_start_steps)
    job_file = workdir / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [{"job_name": "asyncrl", "static_configs": [{
            "targets": [f"127.0.0.1:{metrics_port}"],
            "labels": {"namespace": NAMESPACE, "asyncrljob": JOB, "role": "driver"},
        }]}],
    }))
    prom = f"http://127.0.0.1:{prom_port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_ready(prom, procs[0])
        start = time.time()
        run = subprocess.run(
            [sys.executable, "-m", "asyncrl.trainer.cli", "run", str(job_file), "--quiet",
             "--port", str(metrics_port), "--run-dir", str(workdir / "run")],
            timeout=1800, cwd=workdir)
        if run.returncode != 0:
            raise RuntimeError(f"asyncrl run exited with {run.returncode}")
        end = time.time()
        results = {}
        for _, panels in ROWS:
            for p in panels:
                results[p.title] = [
                    _get(f"{prom}/api/v1/query_range", {
                        "query": substitute(q.expr, NAMESPACE, JOB, RATE_INTERVAL),
                        "start": f"{start:.0f}", "end": f"{end:.0f}", "step": "2s"})["result"]
                    for q in p.queries]
        return results, start, end
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def _points(series: dict[str, Any], start: float) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for t, v in series["values"]:
        y = float(v)
        if math.isfinite(y):
            xs.append((float(t) - start) / 60)
            ys.append(y)
    return xs, ys


def _draw(ax: Any, p: PanelDef, results: list[list[dict[str, Any]]], start: float) -> None:
    ax.set_title(p.title, fontsize=8, loc="left")
    ax.tick_params(labelsize=6)
    if not any(results):
        ax.text(0.5, 0.5, "no data" + (" (no operator runs here)" if "operator" in
                                       " ".join(q.expr for q in p.queries) else ""),
                ha="center", va="center", fontsize=7, color="grey", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if p.kind in ("stat", "phase"):
        series = results[0][0]
        label = _legend(p.queries[0].legend, series["metric"])
        text = label.split(": ")[-1] if p.kind == "phase" else f"{float(series['values'][-1][1]):g}"
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=20, color="tab:green", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if p.kind == "heatmap":
        buckets = sorted(results[0], key=lambda s: float(s["metric"]["le"]))
        cumulative = [_points(s, start)[1] for s in buckets]
        n = min(len(c) for c in cumulative)
        rows = [[c[i] - (cumulative[k - 1][i] if k else 0.0) for i in range(n)] for k, c in enumerate(cumulative)]
        ax.imshow(rows, aspect="auto", origin="lower", cmap="Oranges", interpolation="nearest")
        ax.set_yticks(range(len(buckets)), [s["metric"]["le"] for s in buckets])
        ax.set_xlabel("sample (2 s)", fontsize=6)
        return
    for q, result in zip(p.queries, results, strict=True):
        for series in result:
            xs, ys = _points(series, start)
            dashed = any(_legend(q.legend, series["metric"]).endswith(pat.split("*")[-1].replace("\\", ""))
                         for pat, _ in p.threshold_lines)
            ax.plot(xs, ys, linewidth=1, linestyle="--" if dashed else "-",
                    label=_legend(q.legend, series["metric"]).removeprefix(f"{JOB} "))
    if p.unit == "percentunit":
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_xlabel("minutes", fontsize=6)
    ax.legend(fontsize=5, loc="best")


def render(results: dict[str, list[list[dict[str, Any]]]], start: float, output: Path) -> None:
    panels = [(row, p) for row, ps in ROWS for p in ps]
    cols = 4
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(16, 2.3 * nrows))
    for ax, (row, p) in zip(axes.flat, panels, strict=False):
        _draw(ax, p, results[p.title], start)
        ax.set_title(row, fontsize=6, loc="right", color="grey")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"asyncrl dashboard panels: a real `asyncrl run` ({JOB}) scraped by Prometheus", fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=60)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps of the run")
    parser.add_argument("--warm-start-steps", type=int, default=60, help="supervised warm-start steps")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="asyncrl-render-") as tmp:
        results, start, end = collect(args.steps, args.warm_start_steps, args.prometheus, Path(tmp))
    render(results, start, args.output)
    print(f"{args.output}: {args.output.stat().st_size // 1024} KiB, {end - start:.0f} s of run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
