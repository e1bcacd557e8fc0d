"""`ftjob run`: the job's node commands as local processes, exactly as the operator would render them.

The job is rendered with the same `render_all` as in the cluster; only the config directory, the
checkpoint directory and node 0's address (loopback) differ. Each "node" is one `accelerate launch`
process with its machine rank; without GPUs the job runs on CPU (DeepSpeed's CPU accelerator, gloo).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import RenderOptions, render_all
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


def run_locally(job: FineTuneJob, *, workdir: Path | None = None, nodes: int | None = None, fresh: bool = False) -> int:
    """Render, write the configs, run every node, and report where the adapter went.

    Like a pod, a local run resumes from the newest complete checkpoint in its work directory;
    `fresh` deletes the directory first.
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
    rendered = render_all(job, RenderOptions(config_dir=str(config_dir), checkpoint_dir=str(checkpoint_dir)))
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
    }
    if rendered.topology.num_machines == 1:
        # One machine: accelerate passes torchrun no endpoint and c10d falls back to localhost:29400,
        # shared by every run on this host; pin it to this run's port.
        env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{rendezvous.port}"
    if rendered.topology.use_cpu:
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", "1")
    procs: list[subprocess.Popen[str]] = []
    for rank in range(rendered.topology.num_machines):
        argv = render_node_command(
            job,
            rendered.topology,
            main_process_host="127.0.0.1",
            machine_rank=str(rank),
            config_dir=str(config_dir),
        )
        argv = [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=_pump, args=(proc.stdout, f"[node {rank}] "), daemon=True).start()
        procs.append(proc)
    code = 0
    try:
        for proc in procs:
            rc = proc.wait()
            if rc and not code:
                code = rc
                for other in procs:
                    if other.poll() is None:
                        other.send_signal(signal.SIGTERM)
    except KeyboardInterrupt:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        code = 130
    if code == 0:
        _summarize(Path(rendered.trainer.output.adapter_dir), checkpoint_dir)
    else:
        print(f"ftjob run: failed with exit code {code}", file=sys.stderr)
    return code
