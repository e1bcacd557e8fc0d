#!/usr/bin/env python
"""Operator benchmark on its own local control plane (hack/cluster) with KWOK fake GPU nodes.

    $HOME/.cache/finetune-operator/venv/bin/python bench/operator/bench_operator.py \
        --single 50 --burst 10,100

Measures (see bench/operator/README.md for the formulas):
  (a) single job on an idle cluster: create -> all pods exist, create -> status.phase Running;
  (b) burst of N two-node FineTuneJobs: create -> every job's pods exist, against a floor (a direct
      client creating the same ConfigMap/Service/Indexed Job per job from `render_all`), plus the
      operator's peak RSS, CPU seconds per job and apiserver requests per job.
Writes bench/operator/results/<utc stamp>.json (and latest.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "cluster"
FTJOB = Path(sys.executable).parent / "ftjob"
RESULTS = Path(__file__).parent / "results"
KWOK = "kwok.finetune.dev"
POLICY_FLAGS = [f"--allowed-annotation-prefix={KWOK}/"]  # the pod policy lets jobs set the KWOK hold annotation
GROUP, VERSION, PLURAL = "finetune.dev", "v1alpha1", "finetunejobs"
LABEL = "finetune.dev/job-name"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Resources whose requests are background noise of the fake cluster, not of anyone creating jobs.
NOISE = {"leases", "nodes"}
WATCH_EVENTS_MIN = 0.1  # per job: below it, a resource's watch events are the bookmarks of idle watches
WATCH_METRICS = (("apiserver_watch_events_total", "events"), ("apiserver_watch_events_sizes_sum", "bytes"))
GPUS_PER_NODE = 8
PY_SPY = Path(sys.executable).parent / "py-spy"
GOAL_RATIO = 1.3  # the burst goal: operator create -> all pods <= 1.3x the floor's, at every N, run after run


def log(msg: str) -> None:
    print(f"[bench {datetime.now(UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def nodes_for(jobs: int, gpus_per_pod: int) -> int:
    """Fewest 8-GPU nodes that hold every pod of `jobs` two-node jobs (the target shape: 250 for 1,000 x 2 x 1 GPU)."""
    return max(4, -(-2 * jobs * gpus_per_pod // GPUS_PER_NODE))


def metric_sums(text: str, metric: str, *labels: str) -> Counter[tuple[str, ...]]:
    """One Prometheus counter of a /metrics text, summed per the values of `labels`."""
    out: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            out[tuple(found.get(label, "") for label in labels)] += float(line.rsplit(" ", 1)[1])
    return out


class Bench:
    def __init__(
        self,
        cluster_dir: Path,
        nodes: int,
        gpus_per_pod: int,
        profile: bool = False,
        operator_flags: list[str] | None = None,
    ) -> None:
        self.dir = cluster_dir
        self.operator_flags = operator_flags or []
        self.nodes = nodes
        self.gpus_per_pod = gpus_per_pod
        self.profile = profile
        self.env = {
            **os.environ,
            "FTJOB_CLUSTER_DIR": str(cluster_dir),
            "FTJOB_NODES": str(nodes),
            "FTJOB_GPUS_PER_NODE": str(GPUS_PER_NODE),
            "FTJOB_UP_TIMEOUT": "600",
        }
        self.bin = Path(
            subprocess.run(
                [str(HACK / "build.sh"), "--print-bin"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        self.kubeconfig = cluster_dir / "kubeconfig"
        self.metrics_port = 0  # the running operator's /metrics (set by start_operator)

    # --- cluster -------------------------------------------------------------------------------
    def up(self) -> None:
        log(f"starting cluster in {self.dir} with {self.nodes} KWOK nodes")
        subprocess.run([str(HACK / "down.sh")], env=self.env, check=False, capture_output=True)
        subprocess.run([str(HACK / "up.sh")], env=self.env, check=True)
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.api.configuration.connection_pool_maxsize = 32
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "finetunejob.yaml"))
        self.kubectl("wait", "--for=condition=Established", "crd/finetunejobs.finetune.dev", "--timeout=60s")
        log(f"cluster ready: {self.nodes} Ready nodes")  # up.sh returns once all of them are Ready

    def down(self) -> None:
        subprocess.run([str(HACK / "down.sh")], env=self.env, check=False)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        cmd = [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(cmd, input=input, capture_output=True, text=True, check=True).stdout

    def namespace(self, name: str) -> str:
        from kubernetes import client

        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.core.read_namespaced_service_account("default", name)
                return name
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"no default ServiceAccount in {name}")

    def delete_namespace(self, name: str, wait: float = 180) -> None:
        """Delete a run's namespace and wait until its content is gone (pods, Jobs, endpoints, events: the
        deletion's work must not overlap the next run), not for the namespace itself: once the content is
        removed, the namespace controller's retry backoff (exponential per namespace) can keep it Terminating
        for minutes with nothing left. Content gone = its `NamespaceContentRemaining` condition is False and no
        pod is left: the condition turns False while KWOK still finalizes terminating pods (measured: 1,393
        pod DELETEs of a 1,000-job run's namespace inside the next run's window)."""
        self.core.delete_namespace(name)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                ns = self.core.read_namespace(name)
            except Exception:
                return
            conditions = {c.type: c.status for c in (ns.status.conditions or [])}
            if (
                conditions.get("NamespaceContentRemaining") == "False"
                and not self.core.list_namespaced_pod(name, limit=1).items
            ):
                return
            time.sleep(1)
        log(f"namespace {name} still has content after {wait:.0f}s")

    def api_counts(self) -> tuple[Counter[tuple[str, ...]], Counter[tuple[str, str]]]:
        """From one scrape of the API server's /metrics: requests so far per (verb, resource)
        (`apiserver_request_total`), and watch events and bytes sent so far per (resource, "events" | "bytes"),
        all watchers together (`apiserver_watch_events_total`, `apiserver_watch_events_sizes_sum`). Both runs
        have the same other watchers (controllers, scheduler, KWOK, this client's pod and Job watches), so the
        operator run's watch count less the floor's is about what the operator's watches received (and decoded)."""
        text = self.kubectl("get", "--raw", "/metrics")
        requests = metric_sums(text, "apiserver_request_total", "verb", "resource")
        watches: Counter[tuple[str, str]] = Counter()
        for metric, what in WATCH_METRICS:
            for (resource,), value in metric_sums(text, metric, "resource").items():
                watches[(resource, what)] += value
        return requests, watches

    @staticmethod
    def watch_delta(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]], n: int) -> dict[str, Any]:
        """Watch events and bytes per job by resource (leases, nodes and events left out: background and posts)."""
        per: dict[str, dict[str, float]] = {}
        for (resource, what), value in after.items():
            if resource in NOISE or resource == "events":
                continue
            delta = value - before.get((resource, what), 0)
            if delta > 0:
                per.setdefault(resource, {})[f"{what}_per_job"] = round(delta / n, 2)
        # every watch's bookmarks and resyncs (a few per run) are not the jobs'
        return {r: v for r, v in per.items() if v.get("events_per_job", 0) >= WATCH_EVENTS_MIN}

    def job_controller_queue(self) -> dict[str, float]:
        """The Job controller's work queue so far (kube-controller-manager's /metrics): items, their summed wait
        in the queue and summed sync time. In the operator run the Job controller's wait, not the operator,
        was most of the tail after the last create."""
        import ssl
        import urllib.request

        ports = dict(line.split("=", 1) for line in (self.dir / "ports.env").read_text().splitlines() if "=" in line)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the cluster's own self-signed cert
        try:
            url = f"https://127.0.0.1:{ports['KCM_PORT']}/metrics"
            with urllib.request.urlopen(url, timeout=5, context=context) as r:
                text = r.read().decode()
        except (OSError, KeyError):
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            for metric in ("queue_duration_seconds_sum", "queue_duration_seconds_count", "work_duration_seconds_sum"):
                if line.startswith(f'workqueue_{metric}{{name="job"}}'):
                    out[metric] = float(line.rsplit(" ", 1)[1])
        return out

    @staticmethod
    def queue_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """Job-controller syncs between two readings, and their mean wait in the queue and mean sync time (s)."""
        if not before or not after:
            return {}
        items = after["queue_duration_seconds_count"] - before["queue_duration_seconds_count"]
        wait = after["queue_duration_seconds_sum"] - before["queue_duration_seconds_sum"]
        work = after["work_duration_seconds_sum"] - before["work_duration_seconds_sum"]
        return {
            "syncs": items,
            "mean_wait_s": wait / items if items else 0.0,
            "mean_sync_s": work / items if items else 0.0,
        }

    # --- operator ------------------------------------------------------------------------------
    def start_operator(self, ns: str, log_path: Path, checkout: Path | None = None) -> subprocess.Popen[bytes]:
        """`ftjob operator` for one namespace; `checkout`: run another checkout's operator code (its api/,
        operator/ and trainer/ first on PYTHONPATH, ahead of the virtualenv's editable install of this one)."""
        progress = free_port()
        live = free_port()
        self.metrics_port = free_port()
        args = [
            str(FTJOB),
            "operator",
            "--standalone",
            "--namespace",
            ns,
            "--liveness",
            f"http://127.0.0.1:{live}/healthz",
            "--progress-port",
            str(progress),
            "--metrics-port",
            str(self.metrics_port),
            "--progress-url",
            f"https://127.0.0.1:{progress}",
            *POLICY_FLAGS,
            *self.operator_flags,
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join(str(checkout / part) for part in ("operator", "api", "trainer"))
        proc = subprocess.Popen(args, env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)
        import urllib.request

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"operator exited {proc.returncode}; log {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{live}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return proc
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("operator not live after 60 s")

    def operator_rounds(self) -> float | None:
        """Reconcile rounds the operator has run so far (its `finetune_reconcile_duration_seconds_count`)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("finetune_reconcile_duration_seconds_count"):
                return float(line.rsplit(" ", 1)[1])
        return None

    @staticmethod
    def stop_operator(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    @staticmethod
    def cpu_seconds(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime

    def component_cpu(self, operator: int | None = None) -> dict[str, float]:
        """CPU seconds so far of each control-plane process, the operator and this client (creates + pod watch)."""
        out = {}
        for pidfile in sorted((self.dir / "pids").glob("*.pid")):
            try:
                out[pidfile.stem] = self.cpu_seconds(int(pidfile.read_text()))
            except (OSError, ValueError):
                continue
        if operator is not None:
            out["operator"] = self.cpu_seconds(operator)
        out["client"] = self.cpu_seconds(os.getpid())
        return out

    @staticmethod
    def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before[k], 2) for k in after if k in before}

    @staticmethod
    def peak_rss_mib(pid: int) -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    # --- profiling -----------------------------------------------------------------------------
    @staticmethod
    def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
        """py-spy samples the operator (collapsed stacks, 100 Hz, idle frames dropped) until SIGINT."""
        cmd = [
            str(PY_SPY),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "100",
            "--nonblocking",
            "-o",
            str(out),
        ]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @staticmethod
    def stop_profiler(spy: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        return summarize_profile(out.read_text()) | {"file": str(out)}

    # --- watching ------------------------------------------------------------------------------
    def watch_pods(self, ns: str, seen: dict[str, float], stop: threading.Event) -> threading.Thread:
        """Record the first time each pod is seen (monotonic), keyed by pod name."""
        return self.watch(self.core.list_namespaced_pod, ns, seen, stop)

    def watch_jobs(self, ns: str, seen: dict[str, float], stop: threading.Event) -> threading.Thread:
        """Record the first time each (batch) Job is seen: when the operator's or the floor's create landed."""
        return self.watch(self.batch.list_namespaced_job, ns, seen, stop)

    def watch(self, list_fn: Any, ns: str, seen: dict[str, float], stop: threading.Event) -> threading.Thread:
        """Record the first time each object of a kind is seen (monotonic), keyed by name.

        Each stream resumes at the last resourceVersion and events stay plain JSON: until cb79b75 every 5 s
        stream started with a fresh list of all the namespace's pods, decoded into client models, a cost that
        grew with the run's length and so weighed more on the slower (operator) run.
        """
        from kubernetes import watch

        def run() -> None:
            version: str | None = None
            while not stop.is_set():
                w = watch.Watch()
                kwargs: dict[str, Any] = {"timeout_seconds": 30, "deserialize": False}
                if version:
                    kwargs["resource_version"] = version
                try:
                    for ev in w.stream(list_fn, ns, **kwargs):
                        if ev["type"] == "ERROR":  # 410 Gone: list again
                            version = None
                            break
                        meta = ev["object"]["metadata"]
                        version = meta["resourceVersion"]
                        if ev["type"] == "ADDED" and meta["name"] not in seen:
                            seen[meta["name"]] = time.monotonic()
                        if stop.is_set():
                            w.stop()
                            break
                except Exception as exc:  # pragma: no cover - reconnect from a fresh list
                    log(f"watch: {exc}")
                    version = None
                    time.sleep(0.2)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    # --- bodies --------------------------------------------------------------------------------
    def ftj(self, name: str) -> dict[str, Any]:
        body = yaml.safe_load((REPO / "examples" / "llama-70b-lora-2x8.yaml").read_text())
        body["metadata"] = {"name": name}
        spec = body["spec"]
        spec["distributed"]["gpusPerNode"] = self.gpus_per_pod
        spec["output"]["checkpoints"] = {"emptyDir": {}}
        spec["template"] = {"annotations": {f"{KWOK}/hold": "true"}}
        spec["runPolicy"] = {"backoffLimit": 2}
        return body

    def create_ftj(self, ns: str, name: str) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, self.ftj(name))

    def phase(self, ns: str, name: str) -> str | None:
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        return (obj.get("status") or {}).get("phase")

    # --- (a) single job ------------------------------------------------------------------------
    def single(self, runs: int, workdir: Path) -> dict[str, Any]:
        ns = self.namespace(f"single-{uuid.uuid4().hex[:5]}")
        op = self.start_operator(ns, workdir / "operator-single.log")
        seen: dict[str, float] = {}
        stop = threading.Event()
        self.watch_pods(ns, seen, stop)
        time.sleep(2)
        to_pods, to_running = [], []
        try:
            for i in range(runs):
                name = f"s{i}"
                t0 = time.monotonic()
                self.create_ftj(ns, name)
                prefix = f"{name}-1-"  # Indexed Job pods: <job>-<index>-<random>
                t_pods = t_run = None
                deadline = t0 + 120
                while time.monotonic() < deadline and (t_pods is None or t_run is None):
                    mine = [t for p, t in list(seen.items()) if p.startswith(prefix)]
                    if t_pods is None and len(mine) >= 2:
                        t_pods = max(mine) - t0
                    if t_run is None and self.phase(ns, name) == "Running":
                        t_run = time.monotonic() - t0
                    time.sleep(0.02)
                if t_pods is None or t_run is None:
                    raise RuntimeError(f"single run {i}: pods {t_pods} running {t_run}")
                to_pods.append(t_pods)
                to_running.append(t_run)
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                # idle cluster for the next run: wait until its pods are gone
                deadline = time.monotonic() + 60
                while (
                    time.monotonic() < deadline
                    and self.core.list_namespaced_pod(ns, label_selector=f"{LABEL}={name}").items
                ):
                    time.sleep(0.2)
                if (i + 1) % 10 == 0:
                    log(f"single: {i + 1}/{runs} runs, last pods {t_pods:.3f}s running {t_run:.3f}s")
        finally:
            stop.set()
            rss = self.peak_rss_mib(op.pid)
            self.stop_operator(op)
        self.delete_namespace(ns)
        return {
            "runs": runs,
            "create_to_pods_s": {
                "p50": pct(to_pods, 50),
                "p99": pct(to_pods, 99),
                "mean": statistics.mean(to_pods),
                "min": min(to_pods),
                "max": max(to_pods),
            },
            "create_to_running_s": {
                "p50": pct(to_running, 50),
                "p99": pct(to_running, 99),
                "mean": statistics.mean(to_running),
                "min": min(to_running),
                "max": max(to_running),
            },
            "operator_peak_rss_mib": rss,
            "samples": {"create_to_pods_s": to_pods, "create_to_running_s": to_running},
        }

    # --- (b) burst -----------------------------------------------------------------------------
    def _wait_pods(self, seen: dict[str, float], want: int, t0: float, timeout: float) -> float:
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if len(seen) >= want:
                return max(seen.values()) - t0
            time.sleep(0.05)
        raise RuntimeError(f"only {len(seen)}/{want} pods after {timeout:.0f}s")

    @staticmethod
    def timeline(
        created: list[float], jobs_seen: dict[str, float], pods_seen: dict[str, float], t0: float
    ) -> dict[str, Any]:
        """Per job, seconds from t0: the client's create call returned, its (batch) Job was first seen, its last
        pod was first seen; and where the tail after the client's last create goes.

        `job_lag` (Job seen - create returned) is what the operator adds (in the floor it is ~0: the client
        creates the Job itself); `pods_lag` (last pod - Job seen) is the Job controller's and the API server's.
        """
        last_pod: dict[str, float] = {}
        for pod, t in pods_seen.items():
            job = pod.rsplit("-", 2)[0]  # Indexed Job pods: <job>-<index>-<random>
            last_pod[job] = max(last_pod.get(job, 0.0), t - t0)
        rows = []
        for i, done in enumerate(created):
            job = f"b{i}-1"  # attempt 1 of FineTuneJob b<i>
            seen = jobs_seen.get(job)
            rows.append((round(done, 3), round(seen - t0, 3) if seen else None, round(last_pod.get(job, -1.0), 3)))
        job_lag = [r[1] - r[0] for r in rows if r[1] is not None]
        pods_lag = [r[2] - r[1] for r in rows if r[1] is not None and r[2] >= 0]
        last_create = max(created) if created else 0.0
        last_job = max((r[1] for r in rows if r[1] is not None), default=last_create)
        last_pods = max((r[2] for r in rows), default=last_job)

        def spread(v: list[float]) -> dict[str, float]:
            return {"p50": round(pct(v, 50), 3), "p90": round(pct(v, 90), 3), "max": round(max(v), 3)} if v else {}

        return {
            "job_lag_s": spread(job_lag),
            "pods_lag_s": spread(pods_lag),
            "tail": {
                "last_create_s": round(last_create, 3),
                "last_create_to_last_job_s": round(last_job - last_create, 3),
                "last_job_to_last_pod_s": round(last_pods - last_job, 3),
            },
            "jobs": rows,
        }

    def _requests(self, before: Counter[tuple[str, ...]], after: Counter[tuple[str, ...]]) -> dict[str, Any]:
        delta = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}
        total = sum(delta.values())
        no_noise = sum(v for (verb, res), v in delta.items() if res not in NOISE)
        by = sorted(
            ((f"{verb} {res}", v) for (verb, res), v in delta.items() if res not in NOISE), key=lambda kv: -kv[1]
        )
        return {"total": total, "excluding_noise": no_noise, "by_verb_resource": dict(by[:25])}

    def burst_operator(self, n: int, workdir: Path, timeout: float, checkout: Path | None = None) -> dict[str, Any]:
        ns = self.namespace(f"burst-op-{n}-{uuid.uuid4().hex[:4]}")
        op = self.start_operator(ns, workdir / f"operator-burst-{n}.log", checkout)
        seen: dict[str, float] = {}
        jobs_seen: dict[str, float] = {}
        stop = threading.Event()
        self.watch_pods(ns, seen, stop)
        self.watch_jobs(ns, jobs_seen, stop)
        time.sleep(3)  # operator settled
        load = os.getloadavg()
        spy = self.start_profiler(op.pid, workdir / f"profile-burst-{n}.txt") if self.profile else None
        cpu0 = self.cpu_seconds(op.pid)
        req0, watch0 = self.api_counts()
        comp0 = self.component_cpu(op.pid)
        jq0 = self.job_controller_queue()
        t0 = time.monotonic()
        created: list[float] = []
        for i in range(n):
            self.create_ftj(ns, f"b{i}")
            created.append(time.monotonic() - t0)
        t_created = time.monotonic() - t0
        t_pods = self._wait_pods(seen, 2 * n, t0, timeout)
        cpu_pods = self.cpu_seconds(op.pid) - cpu0
        rounds_pods = self.operator_rounds()
        comp1 = self.component_cpu(op.pid)
        jq1 = self.job_controller_queue()
        req1, watch1 = self.api_counts()
        # then until every job reports Running (status writes are the operator's too)
        deadline = time.monotonic() + timeout
        t_running = None
        while time.monotonic() < deadline:
            objs = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            if sum(1 for o in objs if (o.get("status") or {}).get("phase") == "Running") >= n:
                t_running = time.monotonic() - t0
                break
            time.sleep(0.5)
        cpu_running = self.cpu_seconds(op.pid) - cpu0
        rounds_running = self.operator_rounds()
        req2, _ = self.api_counts()
        rss = self.peak_rss_mib(op.pid)
        stop.set()
        profile = self.stop_profiler(spy, workdir / f"profile-burst-{n}.txt") if spy else None
        self.stop_operator(op)
        self.delete_namespace(ns, wait=600)
        return {
            "profile": profile,
            "load_before": load,
            "timeline": self.timeline(created, jobs_seen, seen, t0),
            "jobs": n,
            "create_calls_s": t_created,
            "create_to_all_pods_s": t_pods,
            "create_to_all_running_s": t_running,
            "operator_cpu_s_to_pods": cpu_pods,
            "operator_cpu_s_to_running": cpu_running,
            "operator_cpu_s_per_job": cpu_running / n,
            "operator_peak_rss_mib": rss,
            "reconcile_rounds_per_job_to_pods": rounds_pods / n if rounds_pods is not None else None,
            "reconcile_rounds_per_job_to_running": rounds_running / n if rounds_running is not None else None,
            "cpu_s_to_pods_by_process": self.cpu_delta(comp0, comp1),
            "job_controller_to_pods": self.queue_delta(jq0, jq1),
            "requests_to_pods": self._requests(req0, req1),
            "requests_to_running": self._requests(req0, req2),
            "watch_events_to_pods": self.watch_delta(watch0, watch1, n),
        }

    def burst_floor(self, n: int, timeout: float) -> dict[str, Any]:
        """The same children, created directly from render_all output (no operator)."""
        from finetune_api.v1alpha1.resource import FineTuneJob
        from finetune_operator.policy import PodPolicy
        from finetune_operator.render import RenderOptions, render_all

        options = RenderOptions(policy=PodPolicy(allowed_annotation_prefixes=(f"{KWOK}/",)))  # = POLICY_FLAGS

        ns = self.namespace(f"burst-floor-{n}-{uuid.uuid4().hex[:4]}")
        seen: dict[str, float] = {}
        jobs_seen: dict[str, float] = {}
        stop = threading.Event()
        self.watch_pods(ns, seen, stop)
        self.watch_jobs(ns, jobs_seen, stop)
        time.sleep(3)
        load = os.getloadavg()
        req0, watch0 = self.api_counts()
        comp0 = self.component_cpu()
        jq0 = self.job_controller_queue()
        t0 = time.monotonic()
        created: list[float] = []
        for i in range(n):  # rendering is inside the timed region: the operator has to do it too
            body = self.ftj(f"b{i}")
            body["metadata"]["namespace"] = ns
            r = render_all(FineTuneJob.from_body(body), options)
            self.core.create_namespaced_config_map(ns, r.config_map)
            self.core.create_namespaced_service(ns, r.service)
            self.batch.create_namespaced_job(ns, _quantities_as_str(r.job))
            created.append(time.monotonic() - t0)
        t_created = time.monotonic() - t0
        t_pods = self._wait_pods(seen, 2 * n, t0, timeout)
        comp1 = self.component_cpu()
        jq1 = self.job_controller_queue()
        req1, watch1 = self.api_counts()
        stop.set()
        self.delete_namespace(ns, wait=600)
        return {
            "load_before": load,
            "timeline": self.timeline(created, jobs_seen, seen, t0),
            "jobs": n,
            "create_calls_s": t_created,
            "create_to_all_pods_s": t_pods,
            "cpu_s_to_pods_by_process": self.cpu_delta(comp0, comp1),
            "job_controller_to_pods": self.queue_delta(jq0, jq1),
            "requests_to_pods": self._requests(req0, req1),
            "watch_events_to_pods": self.watch_delta(watch0, watch1, n),
        }


def series_summary(bursts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per burst size: the ratio of every run (in order), the worst, and whether each run is within the goal."""
    out: dict[str, Any] = {}
    for b in bursts:
        row = out.setdefault(str(b["jobs"]), {"ratios": [], "load_1min_before_floor_op": []})
        row["ratios"].append(round(b["ratio_operator_over_floor"], 3))
        row["load_1min_before_floor_op"].append(
            [round(b["floor"]["load_before"][0], 2), round(b["operator"]["load_before"][0], 2)]
        )
    for row in out.values():
        row["worst"] = max(row["ratios"])
        row["all_within_goal"] = row["worst"] <= GOAL_RATIO
    return out


def series_table(bursts: list[dict[str, Any]]) -> list[str]:
    """One markdown row per run: ratio, the tail after the last create, and the load average before each side."""
    rows = [
        "| N | run | floor: all pods | operator: all pods | ratio | tail floor / op | op: last create -> last Job -> "
        "last pod | op rounds/job | op CPU s/job | load (1/5/15 min) before floor | before operator |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in bursts:
        fl, op = b["floor"], b["operator"]
        tail = (op.get("timeline") or {}).get("tail") or {}
        nan = float("nan")
        tail_fl = fl["create_to_all_pods_s"] - fl["create_calls_s"]
        tail_op = op["create_to_all_pods_s"] - op["create_calls_s"]
        to_job, to_pod = tail.get("last_create_to_last_job_s", nan), tail.get("last_job_to_last_pod_s", nan)
        load_fl = " / ".join(f"{x:.2f}" for x in fl.get("load_before") or [])
        load_op = " / ".join(f"{x:.2f}" for x in op.get("load_before") or [])
        rows.append(
            f"| {b['jobs']} | {b.get('run', 1)} | {fl['create_to_all_pods_s']:.2f} s "
            f"| {op['create_to_all_pods_s']:.2f} s | **{b['ratio_operator_over_floor']:.2f}** "
            f"| {tail_fl:.2f} / {tail_op:.2f} s | {to_job:.2f} + {to_pod:.2f} s "
            f"| {op.get('reconcile_rounds_per_job_to_pods') or nan:.1f} | {op['operator_cpu_s_per_job']:.3f} "
            f"| {load_fl} | {load_op} |"
        )
    return rows


def frame_name(frame: str) -> str:
    """'reconcile (finetune_operator/reconcile.py:42)' -> 'reconcile (finetune_operator/reconcile.py)'."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "finetune_operator/", "lib/python3"):
        if marker in path:
            path = path[path.index(marker) :]
            break
    return f"{name} ({path})"


def summarize_profile(collapsed: str, top: int = 50) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks ('a;b;c 12')."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame_name(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    share = lambda c: [(f, round(v / total, 4)) for f, v in c.most_common(top)]  # noqa: E731
    return {"samples": total, "self": share(own), "inclusive": share(incl)}


def _quantities_as_str(obj: Any) -> Any:
    """The typed client wants resource quantities as strings (the operator sends ints as JSON)."""
    if isinstance(obj, dict):
        return {
            k: (
                str(v)
                if isinstance(v, int) and not isinstance(v, bool) and k in ("limits", "requests")
                else _quantities_as_str(v)
            )
            if not isinstance(v, dict) or k not in ("limits", "requests")
            else {rk: str(rv) for rk, rv in v.items()}
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_quantities_as_str(v) for v in obj]
    return obj


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single", type=int, default=50, help="single-job runs (0: skip)")
    ap.add_argument("--burst", default="10,100", help="comma-separated burst sizes ('' to skip)")
    ap.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="KWOK 8-GPU nodes (default: just enough for the largest burst, 2*N*gpus/8, at least 4)",
    )
    ap.add_argument(
        "--gpus-per-pod",
        type=int,
        default=1,
        help="spec.distributed.gpusPerNode of each 2-node job (default 1: 8 pods per 8-GPU node)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="sample the operator with py-spy during each burst (costs CPU: numbers not comparable)",
    )
    ap.add_argument("--cluster-dir", default="/tmp/ftjob-bench-cluster")
    ap.add_argument("--timeout", type=float, default=900, help="per-burst timeout, s")
    ap.add_argument("--keep-cluster", action="store_true")
    ap.add_argument(
        "--operator-flag",
        action="append",
        default=[],
        help="extra flag for `ftjob operator`, e.g. --operator-flag=--max-concurrent-reconciles=4 (repeatable)",
    )
    ap.add_argument(
        "--baseline-checkout",
        type=Path,
        default=None,
        help="also run each burst with the operator code of this checkout (a git worktree of an older commit), "
        "against the same floor, in alternating order: a paired before/after on a machine whose load drifts",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole --burst list this many times on one cluster (3 with 10,100,300,1000: the 3x4 series)",
    )
    args = ap.parse_args()
    bursts = [int(x) for x in args.burst.split(",") if x.strip()]
    nodes = args.nodes or nodes_for(max(bursts or [0]), args.gpus_per_pod)
    workdir = Path(args.cluster_dir) / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    b = Bench(Path(args.cluster_dir), nodes, args.gpus_per_pod, args.profile, args.operator_flag)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result: dict[str, Any] = {
        "date": stamp,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "kwok_nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "gpus_per_pod": args.gpus_per_pod,
        "job": f"examples/llama-70b-lora-2x8.yaml (2 nodes x {args.gpus_per_pod} GPU(s), KWOK hold)",
        "profiled": args.profile,
        "operator_flags": args.operator_flag,
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{stamp}.json"

    def save() -> None:
        out.write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "latest.json").write_text(json.dumps(result, indent=2) + "\n")

    b.up()
    try:
        if args.single:
            log(f"(a) single job x {args.single}")
            result["single"] = b.single(args.single, workdir)
            save()
            s = result["single"]
            log(
                f"single: pods p50 {s['create_to_pods_s']['p50']:.3f} p99 {s['create_to_pods_s']['p99']:.3f}; "
                f"running p50 {s['create_to_running_s']['p50']:.3f} p99 {s['create_to_running_s']['p99']:.3f}"
            )
        result["burst"] = []
        for run, n in ((r, n) for r in range(1, args.repeat + 1) for n in bursts):
            log(f"(b) burst {n} (run {run}/{args.repeat}): floor; load {os.getloadavg()}")
            floor = b.burst_floor(n, args.timeout)
            log(f"(b) burst {n}: floor {floor['create_to_all_pods_s']:.2f}s; operator")
            base = None
            if args.baseline_checkout is not None and run % 2 == 0:  # even runs: the baseline first
                base = b.burst_operator(n, workdir, args.timeout, args.baseline_checkout)
            oper = b.burst_operator(n, workdir, args.timeout)
            if args.baseline_checkout is not None and run % 2 == 1:
                base = b.burst_operator(n, workdir, args.timeout, args.baseline_checkout)
            ratio = oper["create_to_all_pods_s"] / floor["create_to_all_pods_s"]
            req_op = oper["requests_to_pods"]["excluding_noise"]
            req_fl = floor["requests_to_pods"]["excluding_noise"]
            result["burst"].append(
                {
                    "jobs": n,
                    "run": run,
                    "floor": floor,
                    "operator": oper,
                    "ratio_operator_over_floor": ratio,
                    "requests_per_job_operator_run": req_op / n,
                    "requests_per_job_floor_run": req_fl / n,
                    "requests_per_job_attributable_to_operator": (req_op - req_fl) / n,
                }
            )
            if base is not None:
                result["burst"][-1] |= {
                    "baseline_checkout": str(args.baseline_checkout),
                    "baseline_commit": subprocess.run(
                        ["git", "-C", str(args.baseline_checkout), "rev-parse", "HEAD"], capture_output=True, text=True
                    ).stdout.strip(),
                    "operator_baseline": base,
                    "ratio_baseline_over_floor": base["create_to_all_pods_s"] / floor["create_to_all_pods_s"],
                }
                base_ratio = result["burst"][-1]["ratio_baseline_over_floor"]
                log(f"burst {n}: baseline operator {base['create_to_all_pods_s']:.2f}s (x{base_ratio:.2f})")
            save()
            log(
                f"burst {n}: operator {oper['create_to_all_pods_s']:.2f}s vs floor "
                f"{floor['create_to_all_pods_s']:.2f}s (x{ratio:.2f}); rss {oper['operator_peak_rss_mib']:.0f} MiB; "
                f"cpu/job {oper['operator_cpu_s_per_job']:.3f}s; req/job {req_op / n:.1f} vs floor {req_fl / n:.1f}"
            )
        result["summary"] = series_summary(result["burst"])
    finally:
        save()
        if not args.keep_cluster:
            b.down()
    if result.get("burst"):
        print("\n".join(series_table(result["burst"])))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
