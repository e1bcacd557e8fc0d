"""`ftjob run`: the job's node commands as local processes, exactly as the operator would render them.

The job is admitted and rendered with the same `admit` and `render` as in the cluster; only the config directory,
the checkpoint directory and node 0's address (loopback) differ. Each "node" is the pod's command (the launcher
around `accelerate launch`, `render/command.py`) with its machine rank, run by this interpreter; without GPUs the
job runs on CPU (DeepSpeed's CPU accelerator, gloo). The run's exit code is what a pod's would be: a permanent
trainer error (64-66) ends every node at once and is returned as is.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from finetune_api import constants
from finetune_api.termination import PERMANENT_MEANINGS
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.admit import admit_or_raise
from finetune_operator.render import RenderContext, RenderOptions, render
from finetune_operator.render.command import render_node_command


def local_gpu_count() -> int:
    """GPUs visible here, without importing torch (which takes seconds)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def fit_to_machine(job: FineTuneJob, *, nodes: int | None, gpus_here: int) -> tuple[FineTuneJob, list[str]]:
    """The job adjusted to this machine (CPU when no GPU), and the notes to print about it. Pure."""
    notes: list[str] = []
    dist = job.spec.distributed.model_copy()
    if nodes is not None:
        dist.nodes = nodes
    if dist.gpus_per_node and gpus_here == 0:
        notes.append(f"no GPU here: running {dist.nodes} node(s) on CPU instead of {dist.gpus_per_node} GPU(s) each")
        dist.processes_per_node = dist.processes_per_node or 1
        dist.gpus_per_node = 0
    elif dist.gpus_per_node and dist.nodes * dist.gpus_per_node > gpus_here:
        raise SystemExit(
            f"ftjob run: the job wants {dist.nodes} x {dist.gpus_per_node} GPUs and this machine has {gpus_here}; "
            "use --nodes or lower spec.distributed.gpusPerNode"
        )
    spec = job.spec.model_copy(update={"distributed": dist})
    return job.model_copy(update={"spec": spec}), notes


def local_argv(pod_command: list[str]) -> list[str]:
    """The pod's command with `python` as this interpreter (its `accelerate` comes first on PATH, see env)."""
    return [sys.executable if arg == "python" and i == 0 else arg for i, arg in enumerate(pod_command)]


def first_failure(codes: list[int]) -> int:
    """The run's exit code from the nodes' codes in the order they ended: a permanent code wins (the other
    nodes were stopped because of it), else the first failure, else 0."""
    permanent = [c for c in codes if c in constants.EXIT_PERMANENT_CODES]
    failed = [c for c in codes if c != 0]
    return (permanent or failed or [0])[0]


def _free_port(preferred: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])


def _pump(stream: IO[str], prefix: str) -> None:
    for line in stream:
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()


def _summarize(adapter_dir: Path, checkpoint_dir: Path) -> None:
    print(f"\nadapter: {adapter_dir}")
    for png in sorted(adapter_dir.glob("*.png")):
        print(f"loss curve: {png}")
    metrics_file = checkpoint_dir / "metrics.jsonl"
    if metrics_file.exists():
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
        losses = [(row["step"], row["loss"]) for row in rows if "loss" in row]
        print("loss by step: " + "  ".join(f"{step}:{loss:.3f}" for step, loss in losses))


def _wait_all(procs: list[subprocess.Popen[str]]) -> int:
    """Wait for every node; once one fails, stop the others (SIGTERM, as the Job controller would)."""
    codes: list[int] = []
    running = list(procs)
    while running:
        for proc in list(running):
            rc = proc.poll()
            if rc is None:
                continue
            running.remove(proc)
            if rc != 0 and not any(codes):
                for other in running:
                    other.send_signal(signal.SIGTERM)
            codes.append(rc)
        time.sleep(0.2)
    return first_failure(codes)


def run_locally(
    job: FineTuneJob,
    *,
    workdir: Path | None = None,
    nodes: int | None = None,
    fresh: bool = False,
    verbose: bool = False,
) -> int:
    """Render, write the configs, run every node, and report where the adapter went.

    Like a pod, a local run resumes from the newest complete checkpoint in its work directory;
    `fresh` deletes the directory first. The trainer prints what `finetune_trainer.output` lets through (its
    `FTJOB_LOG_LEVEL`, passed on from this environment); `verbose` sets it to `debug`: every warning every time,
    from every rank.
    """
    job, notes = fit_to_machine(job, nodes=nodes, gpus_here=local_gpu_count())
    for note in notes:
        print(f"ftjob run: {note}")
    workdir = (workdir or Path("ftjob-runs") / job.name).resolve()
    if fresh and workdir.exists():
        shutil.rmtree(workdir)
    elif any(workdir.glob("checkpoints/checkpoint-*")):
        print(f"ftjob run: {workdir} holds checkpoints: resuming (use --fresh to start over)")
    config_dir, checkpoint_dir = workdir / "config", workdir / "checkpoints"
    config_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    dist = job.spec.distributed
    rendezvous = dist.rendezvous.model_copy(update={"port": _free_port(dist.rendezvous.port)})
    job = job.model_copy(
        update={"spec": job.spec.model_copy(update={"distributed": dist.model_copy(update={"rendezvous": rendezvous})})}
    )
    options = RenderOptions(config_dir=str(config_dir), checkpoint_dir=str(checkpoint_dir))
    context = RenderContext(job, admit_or_raise(job), attempt=1, options=options)  # the job as fitted to this machine
    rendered = render(context)
    for name, text in rendered.files.items():
        (config_dir / name).write_text(text)
    print(
        f"ftjob run: {job.name}: {rendered.topology.num_machines} node(s) x "
        f"{rendered.topology.processes_per_machine} process(es), ZeRO-{rendered.plan.strategy.zero_stage}, "
        f"configs in {config_dir}"
    )
    env = {
        **os.environ,
        constants.ENV_JOB_NAME: job.name,
        constants.ENV_JOB_NAMESPACE: job.namespace,
        constants.ENV_ATTEMPT: "1",
        "PYTHONUNBUFFERED": "1",
        **({constants.ENV_LOG_LEVEL: "debug"} if verbose else {}),
        # The pod command says `accelerate`: this installation's, next to this interpreter.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    if rendered.topology.num_machines == 1:
        # One machine: accelerate passes torchrun no endpoint and c10d falls back to localhost:29400,
        # shared by every run on this host; pin it to this run's port.
        env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{rendezvous.port}"
    if rendered.topology.use_cpu:
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", "1")
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []
    for rank in range(rendered.topology.num_machines):
        argv = render_node_command(context.on_local_node(rank))
        proc = subprocess.Popen(
            local_argv(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches only us; each launcher gets one SIGTERM, as in a pod
        )
        pumps.append(threading.Thread(target=_pump, args=(proc.stdout, f"[node {rank}] "), daemon=True))
        pumps[-1].start()
        procs.append(proc)
    try:
        code = _wait_all(procs)
    except KeyboardInterrupt:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait()
        code = 130
    for pump in pumps:
        pump.join(timeout=10)  # the nodes' last lines before our verdict
    if code == 0:
        _summarize(Path(rendered.trainer.output.adapter_dir), checkpoint_dir)
    else:
        meaning = PERMANENT_MEANINGS.get(code)
        why = f" (permanent: {meaning}; not retried)" if meaning else ""
        print(f"ftjob run: failed with exit code {code}{why}", file=sys.stderr)
    return code
