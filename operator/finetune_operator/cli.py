"""`ftjob`: crd, render, plan, run, operator, status, watch, logs. Thin: parse arguments, call the core, print.

Exit status 2 means the job file is invalid; the message names every field that is wrong. `plan`, `render` and
`run` read the job through one function (`load_job`), which applies the operator's own rules
(`validation.check_job`), so the three accept and reject exactly the same jobs, with the same words.

The pod policy (what `spec.template` may ask for, `finetune_operator.policy`): `operator`, `render` and `plan`
take its flags (`--allowed-*`, `--pod-security-level`); without them, `render` and `plan` assume the defaults
an operator installed by the chart has (for `render`, with the image of `--image`), and `run` always does.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.policy import PodPolicy, add_policy_flags, policy_from_flags
from finetune_operator.validation import check_job
from finetune_operator.view.flags import add_cluster_flags

EXIT_INVALID = 2


def load_job(path: str, policy: PodPolicy | None = None) -> FineTuneJob:
    """Read one FineTuneJob from a YAML file (the first FineTuneJob document); InvalidSpecError naming every
    field the operator would reject, under `policy` (default: the operator's default pod policy)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        documents = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise InvalidSpecError.from_message(path, f"not valid YAML: {exc}") from None
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == "FineTuneJob"]
    if not jobs:
        raise InvalidSpecError.from_message(path, "holds no document of kind FineTuneJob")
    job = FineTuneJob.from_body(jobs[0])
    errors = check_job(job, policy)
    if errors:
        raise InvalidSpecError(errors)
    return job


def _policy(args: argparse.Namespace) -> PodPolicy:
    """The pod policy of the command's flags; without any, the operator's defaults for the same `--image`."""
    from finetune_api import constants

    return policy_from_flags(args, image=getattr(args, "image", None) or constants.DEFAULT_TRAINER_IMAGE)


def _crd(args: argparse.Namespace) -> int:
    from finetune_operator.crd import build_crd

    text = yaml.safe_dump(build_crd(), sort_keys=False, width=120)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _render(args: argparse.Namespace) -> int:
    from finetune_api import constants
    from finetune_operator.render import RenderOptions, dump_yaml, render_all

    policy = _policy(args)
    options = RenderOptions(image=args.image, policy=policy)
    rendered = render_all(load_job(args.job, policy), options, attempt=args.attempt)  # admits, then renders
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.files.items():
        (out / name).write_text(text)
    stale = out / constants.DEEPSPEED_FILE
    if constants.DEEPSPEED_FILE not in rendered.files and stale.exists():
        stale.unlink()
    (out / "manifests.yaml").write_text("---\n".join(dump_yaml(m) for m in rendered.manifests))
    print(f"wrote {', '.join(sorted([*rendered.files, 'manifests.yaml']))} to {out}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from finetune_operator.admit import admit_or_raise
    from finetune_operator.planreport import format_plan

    policy = _policy(args)
    job = load_job(args.job, policy)
    print(format_plan(job, admit_or_raise(job, policy).plan))
    return 0


def _run(args: argparse.Namespace) -> int:
    from finetune_operator.local import run_locally

    return run_locally(
        load_job(args.job),
        workdir=Path(args.workdir) if args.workdir else None,
        nodes=args.nodes,
        fresh=args.fresh,
        verbose=args.verbose,
    )


def _operator(args: argparse.Namespace) -> int:
    from finetune_operator.handlers.main import run_operator

    return int(run_operator(args) or 0)


def _view(args: argparse.Namespace) -> int:
    from finetune_operator.view.client import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ftjob", description="Fine-tune LLMs on Kubernetes (FineTuneJob).")
    sub = parser.add_subparsers(dest="command", required=True)

    crd = sub.add_parser("crd", help="print the CustomResourceDefinition YAML")
    crd.add_argument("--out", help="write to this file instead of stdout")
    crd.set_defaults(func=_crd)

    render = sub.add_parser(
        "render", help="write accelerate.yaml, deepspeed.json, trainer.json, manifests.yaml"
    )
    render.add_argument("job", help="FineTuneJob YAML file ('-' for stdin)")
    render.add_argument("--out", required=True, help="output directory")
    render.add_argument("--image", default=None, help="trainer image (default: the operator's default)")
    render.add_argument("--attempt", type=int, default=1, help="attempt number of the rendered Job")
    add_policy_flags(render)
    render.set_defaults(func=_render)

    plan = sub.add_parser("plan", help="print the memory estimate and the chosen ZeRO strategy")
    plan.add_argument("job")
    add_policy_flags(plan)
    plan.set_defaults(func=_plan)

    run = sub.add_parser("run", help="run the job on this machine (CPU, local GPUs, or several local nodes)")
    run.add_argument("job")
    run.add_argument(
        "--workdir", help="where configs, checkpoints and the adapter go (default: ./ftjob-runs/NAME)"
    )
    run.add_argument("--nodes", type=int, default=None, help="override the number of local 'nodes'")
    run.add_argument("--fresh", action="store_true", help="delete the work directory first instead of resuming")
    run.add_argument(
        "--verbose", action="store_true", help="the trainer's every line: each warning each time, every rank"
    )
    run.set_defaults(func=_run)

    op = sub.add_parser("operator", help="run the operator (what the Helm chart's Deployment runs)")
    op.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    op.add_argument("--all-namespaces", action="store_true", help="watch every namespace (the default)")
    op.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint")
    op.add_argument("--peering", default=None, help="kopf peering name (enables peering when set)")
    op.add_argument("--standalone", action="store_true", help="no peering (single replica, tests)")
    op.add_argument("--verbose", action="store_true")
    op.add_argument("--priority", type=int, default=0, help="kopf peering priority (distinct per replica)")
    op.add_argument("--image", default=None, help="default trainer image (spec.template.image wins)")
    op.add_argument("--progress-url", default=None,
                    help="URL the trainer pods report progress to, e.g. https://finetune-operator.NS.svc:8443")
    op.add_argument("--progress-port", type=int, default=8443, help="HTTPS port of the progress endpoint")
    op.add_argument("--progress-cert", default=None, help="TLS certificate file (default: self-signed)")
    op.add_argument("--progress-key", default=None, help="TLS key file (default: self-signed)")
    op.add_argument("--progress-ca", default=None,
                    help="CA certificate the trainer pods pin (default: the self-signed cert, if self-signed)")
    op.add_argument("--progress-host", action="append", default=[],
                    help="DNS name or IP in the self-signed certificate (repeatable)")
    op.add_argument("--metrics-port", type=int, default=9090, help="HTTP port of /metrics")
    op.add_argument("--max-concurrent-reconciles", type=int, default=16,
                    help="reconcile rounds in flight at once, over all jobs (default 16)")
    add_policy_flags(op)
    op.set_defaults(func=_operator)

    status = sub.add_parser("status", help="show a FineTuneJob: phase, progress, plan, conditions, recent events")
    add_cluster_flags(status)
    status.set_defaults(func=_view)
    watch = sub.add_parser("watch", help="follow a FineTuneJob until it Succeeded (exit 0) or Failed (exit 1)")
    add_cluster_flags(watch)
    watch.set_defaults(func=_view)
    logs = sub.add_parser("logs", help="print the log of rank 0 of the job's current attempt")
    add_cluster_flags(logs)
    logs.add_argument("-f", "--follow", action="store_true",
                      help="follow it, and rank 0 of the next attempt when the job restarts")
    logs.set_defaults(func=_view)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "image", "unset") is None:
        from finetune_api import constants

        args.image = constants.DEFAULT_TRAINER_IMAGE
    try:
        result: Any = args.func(args)
    except InvalidSpecError as exc:
        print(f"ftjob {args.command}: invalid FineTuneJob:", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error}", file=sys.stderr)
        return EXIT_INVALID
    except FileNotFoundError as exc:
        print(f"ftjob {args.command}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
