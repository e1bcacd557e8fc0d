"""Shared helpers for bench/run_bench.py and bench/correctness.py: render a FineTuneJob exactly as the operator
does (`finetune_operator.render.render_all`), run its node commands as local "nodes" (one `accelerate launch` per
machine rank, static loopback address, CUDA_VISIBLE_DEVICES split per node), time-box everything, and kill only the
process groups we started.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}

_port = [29600 if "FTJOB_BENCH_PORT_BASE" not in os.environ else int(os.environ["FTJOB_BENCH_PORT_BASE"])]
OWNER_VAR = "FTJOB_BENCH_OWNER"
OWNER = str(os.getpid())
os.environ[OWNER_VAR] = OWNER  # children started any other way (subprocess.run) are ours too, not our parent's


def port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return False
        except OSError:
            return True


def port_listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def next_port() -> int:
    """A port nobody listens on now (other people's tests may run on this host)."""
    _port[0] += 7
    while port_in_use(_port[0]) or port_in_use(_port[0] + 1):
        _port[0] += 7
    return _port[0]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in NCCL_ENV.items():
        env.setdefault(k, v)
    env.update(OFFLINE_ENV)
    pp = [str(REPO / "api"), str(REPO / "operator"), str(REPO / "trainer")]
    if env.get("PYTHONPATH"):
        pp.insert(0, env["PYTHONPATH"])
    env["PYTHONPATH"] = ":".join(pp)
    env.setdefault("FTJOB_CACHE", "/tmp/ftjob-cache")
    env.setdefault("HF_DATASETS_CACHE", "/tmp/hf_datasets_cache")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class RenderedRun:
    job_dict: dict[str, Any]
    workdir: Path
    config_dir: Path
    checkpoint_dir: Path
    node_argv: list[list[str]]
    plan: Any
    rendered: Any
    gpus_per_node: int
    nodes: int
    files: dict[str, str] = field(default_factory=dict)


def render_job(job_dict: dict[str, Any], workdir: Path, *, timed: bool, trainer_updates: dict | None = None
               ) -> RenderedRun:
    """render_all on the job, files written to workdir/config, node commands for local ranks.

    `trainer_updates` (e.g. {"output": {"probePath": ...}}) is merged into trainer.json after rendering: only for
    fields the operator never renders (test probes)."""
    from finetune_api.v1alpha1.resource import FineTuneJob
    from finetune_operator.render import RenderOptions, render_all, render_files
    from finetune_operator.render.command import LAUNCHER, render_node_command
    from finetune_api.trainer_input import TrainerInput

    job = FineTuneJob.model_validate(job_dict)
    config_dir, checkpoint_dir = workdir / "config", workdir / "checkpoints"
    config_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    rendered = render_all(job, RenderOptions(config_dir=str(config_dir), checkpoint_dir=str(checkpoint_dir)))
    files = dict(rendered.files)
    if trainer_updates:
        trainer = TrainerInput.model_validate(deep_merge(rendered.trainer.to_dict(), trainer_updates))
        files = render_files(rendered.accelerate, rendered.deepspeed, trainer)
    for name, text in files.items():
        (config_dir / name).write_text(text)
    argvs = []
    for rank in range(rendered.topology.num_machines):
        argv = render_node_command(rendered.context.on_local_node(rank))
        argv = argv[len(LAUNCHER):]  # the launch itself: the pod's launcher around it adds nothing to time
        assert argv[:2] == ["accelerate", "launch"], argv
        argv = [PY, "-m", "accelerate.commands.launch", *argv[2:]]
        if timed:
            i = argv.index("-m", 3)
            assert argv[i + 1] == "finetune_trainer"
            argv = [*argv[:i], str(REPO / "bench" / "ours_timed.py"), *argv[i + 2:]]
        argvs.append(argv)
    d = job.spec.distributed
    return RenderedRun(job_dict, workdir, config_dir, checkpoint_dir, argvs, rendered.plan, rendered,
                       d.gpus_per_node, d.nodes, files)


class Proc:
    """A process in its own session (so its whole group can be killed), output to a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path = REPO) -> None:
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "ab", buffering=0)  # noqa: SIM115
        self.log.write(f"\n$ {' '.join(argv)}\n".encode())
        env = {**env, OWNER_VAR: OWNER}  # inherited by every worker: what kill_leftovers may kill
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.t0 = time.time()

    def poll(self) -> int | None:
        return self.p.poll()

    def descendants(self) -> list[int]:
        """Every process below the launcher: torch elastic starts its workers in sessions of their own, so a
        process-group kill alone would leave them running (a pod's death takes the whole container)."""
        try:
            import psutil

            return [c.pid for c in psutil.Process(self.p.pid).children(recursive=True)]
        except Exception:
            return []

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to the launcher's group and to each of its descendants, by pid."""
        kids = self.descendants()
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass
        for pid in kids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def terminate_launcher(self) -> None:
        """SIGTERM to the launcher only, as the kubelet does to a container's PID 1; torchrun forwards it."""
        try:
            self.p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGTERM)
            time.sleep(5)
            self.kill_group(signal.SIGKILL)
            try:
                return self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                return 124
        finally:
            pass

    def close(self) -> None:
        if self.poll() is None:
            self.kill_group(signal.SIGKILL)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        # workers of a killed launcher may have left the group's session: by pid only, never by name
        self.log.close()


def node_envs(run: RenderedRun, gpu_offset: int, extra: dict[str, str] | None) -> list[dict[str, str]]:
    envs = []
    name = run.job_dict["metadata"]["name"]
    for rank in range(run.nodes):
        e = {"FTJOB_NAME": name, "FTJOB_NAMESPACE": "bench", "FTJOB_ATTEMPT": "1",
             "FTJOB_TERMINATION_LOG": str(run.workdir / f"termination-{rank}.log")}
        if run.gpus_per_node:
            g = run.gpus_per_node
            e["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu_offset + rank * g + i) for i in range(g))
        else:
            e["DS_ACCELERATOR"] = "cpu"
            e["OMP_NUM_THREADS"] = "1"
        envs.append(base_env({**e, **(extra or {})}))
    return envs


def start_nodes(run: RenderedRun, *, gpu_offset: int = 0, extra_env: dict[str, str] | None = None,
                log_prefix: str = "") -> list[Proc]:
    """Node 0 first; the others once node 0's launcher holds the rendezvous port. On one host every node's c10d
    agent may try to host the store (127.0.0.1 is "this machine" for all of them), and accelerate's rank-0 launcher
    refuses a port already bound, so rank 0 must bind first (in a cluster each pod has its own address)."""
    envs = node_envs(run, gpu_offset, extra_env)
    procs = [Proc(run.node_argv[0], envs[0], run.workdir / f"{log_prefix}node0.log")]
    port = int(run.job_dict["spec"]["distributed"]["rendezvous"]["port"])
    deadline = time.time() + 60
    while len(run.node_argv) > 1 and not port_listening(port) and time.time() < deadline and procs[0].poll() is None:
        time.sleep(0.5)
    for rank in range(1, len(run.node_argv)):
        procs.append(Proc(run.node_argv[rank], envs[rank], run.workdir / f"{log_prefix}node{rank}.log"))
    return procs


def wait_all(procs: list[Proc], timeout: float) -> list[int]:
    """Wait for every node; when one fails, give the others 30 s, then end them (like the operator would)."""
    deadline = time.time() + timeout
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes]  # type: ignore[arg-type]
        now = time.time()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > 30):
            for p in procs:
                if p.poll() is None:
                    p.kill_group(signal.SIGTERM)
            time.sleep(5)
            for p in procs:
                if p.poll() is None:
                    p.kill_group(signal.SIGKILL)
            out = []
            for p in procs:
                try:
                    out.append(int(p.p.wait(timeout=20)))
                except subprocess.TimeoutExpired:
                    out.append(124)
            return [124 if (now > deadline and c != 0) else c for c in out]
        time.sleep(1)


def leftover_gpu_pids() -> list[int]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.split() if x.strip().isdigit()]


def started_here(pid: int) -> bool:
    """Whether `pid` descends from a Proc of this driver process (its environment carries our owner tag)."""
    try:
        return f"{OWNER_VAR}={OWNER}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def kill_leftovers(log: Any = print) -> None:
    """GPU processes still alive after a job ended that this driver started (workers of torch elastic live in
    sessions of their own and outlive a killed launcher). A background driver's processes (correctness.py beside
    run_bench.py) carry another owner tag and are left alone."""
    for pid in leftover_gpu_pids():
        if pid == os.getpid() or not started_here(pid):
            continue
        log(f"killing leftover GPU process {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())
