"""`ftjob operator` runs with the chart's RBAC, not admin: a kubeconfig holding a TokenRequest token of
the chart's ServiceAccount, the Deployment's own command line (the priority wrapper, the peering,
namespace and progress flags, the chart's generated certificate), and a FineTuneJob that must get its
children, take a progress report (TokenReview) and reach Succeeded without one Forbidden.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.operator.conftest import apply, free_port, ftj, items, wait_phase

from .conftest import Cluster, Helm, wait_until

pytestmark = pytest.mark.controlplane
# kopf's INFO lines when peering pauses or resumes a replica. With mandatory peering a replica starts
# paused and says nothing until it resumes, so a replica is active when its last such line is RESUMED.
PAUSED, RESUMED = "Pausing operations", "Resuming operations"
FORBIDDEN_MARKS = ("Forbidden", "forbidden", "Not enough permissions")


def token_kubeconfig(cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig for the admin kubeconfig's server and CA, authenticating as the ServiceAccount."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    token = cluster.kubectl("-n", namespace, "create", "token", sa, "--duration=1h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "chart-sa",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "chart-sa", "context": {"cluster": "local", "user": sa, "namespace": namespace}}],
    }))
    return path


def local_command(deployment: dict[str, Any], tmp: Path, secret: dict[str, Any], ports: dict[str, int]) -> list[str]:
    """The Deployment's container command + args, with local ports and the Secret's files on disk."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp / key).write_bytes(base64.b64decode(secret["data"][key]))
    local = {
        "--liveness": f"http://127.0.0.1:{ports['liveness']}/healthz",
        "--progress-port": str(ports["progress"]),
        "--metrics-port": str(ports["metrics"]),
        "--progress-cert": str(tmp / "tls.crt"),
        "--progress-key": str(tmp / "tls.key"),
        "--progress-ca": str(tmp / "ca.crt"),
    }
    args = [f"{flag}={local[flag]}" if flag in local else arg
            for arg in container["args"] for flag in [arg.split("=", 1)[0]]]
    command = list(container["command"])
    if command[0] == "python":
        command[0] = sys.executable
    return [*command, *args]


def post_progress(port: int, ca: bytes, namespace: str, name: str, token: str) -> int:
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False  # the cert names the progress Service; we reach it on 127.0.0.1
    url = f"https://127.0.0.1:{port}/v1/namespaces/{namespace}/finetunejobs/{name}/progress"
    body = json.dumps({"progress": {"step": 3, "totalSteps": 30, "loss": 2.5, "percent": 10.0}}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@dataclass
class ChartOperator:
    """One `ftjob operator` replica running locally as the chart's ServiceAccount, from the Deployment's
    own command line (so also its random-priority wrapper)."""

    release: Any
    secret: dict[str, Any]
    ports: dict[str, int]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def live(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, f"operator exited:\n{self.log()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['liveness']}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def identity(self, peers: dict[str, Any]) -> str | None:
        """Its key in the peering status: the operator names itself `<hostname>/<pid>/<random>`."""
        assert self.proc is not None
        return next((peer for peer in peers if peer.split("/")[1:2] == [str(self.proc.pid)]), None)

    def active(self) -> bool:
        lines = [line for line in self.log().splitlines() if PAUSED in line or RESUMED in line]
        return bool(lines) and RESUMED in lines[-1]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def chart_operators(
    install: Any, cluster: Cluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[list[ChartOperator]]:
    """Replicas of the chart's operator (namespaced mode, peering on), as many as `replicas` values says."""
    # verbose: kopf logs peering and handler lines at INFO, which the tests read; the pod policy lets the test jobs
    # carry the KWOK annotations that say how their pods run.
    release = install(namespace, {"watchNamespaces": [namespace], "verbose": True,
                                  "podPolicy": {"allowedAnnotationPrefixes": ["kwok.finetune.dev/"]}})
    deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment", release.fullname,
                                            "-o", "json").stdout)
    secret = json.loads(cluster.kubectl("-n", namespace, "get", "secret", f"{release.fullname}-progress-tls",
                                        "-o", "json").stdout)
    kubeconfig = token_kubeconfig(cluster, namespace, release.fullname, tmp_path / "kubeconfig")
    assert whoami(cluster, kubeconfig) == release.sa  # the operators below are this ServiceAccount, not admin
    replicas: list[ChartOperator] = []
    for i in range(deployment["spec"]["replicas"]):
        ports = {"liveness": free_port(), "progress": free_port(), "metrics": free_port()}
        workdir = tmp_path / f"replica-{i}"
        workdir.mkdir()
        op = ChartOperator(release, secret, ports, workdir / "operator.log")
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        with op.log_path.open("wb") as log:
            op.proc = subprocess.Popen(local_command(deployment, workdir, secret, ports), env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
        replicas.append(op)
    try:
        for op in replicas:
            wait_until(op.live, timeout=60, interval=0.2, what="operator liveness")
        yield replicas
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            raise AssertionError("test failed")
        for op in replicas:
            forbidden = [line for line in op.log().splitlines() if any(m in line for m in FORBIDDEN_MARKS)]
            assert not forbidden, "\n".join(forbidden)
    except BaseException:
        for op in replicas:
            sys.stderr.write(f"\n--- operator log {op.log_path.parent.name} ---\n{op.log()[-20000:]}\n")
        raise
    finally:
        for op in replicas:
            op.stop()


@pytest.fixture
def chart_operator(chart_operators: list[ChartOperator]) -> ChartOperator:
    """The active replica (peering keeps the other one paused)."""
    return active_replica(chart_operators)


def active_replica(replicas: list[ChartOperator]) -> ChartOperator:
    """The replica with the highest priority in the peering object, once it alone is active.

    Replicas starting together may both run for a moment before they see each other, so this waits
    until every replica has registered and the state has settled.
    """
    release = replicas[0].release
    peering_cmd = ("-n", release.namespace, "get", "kopfpeering", release.fullname, "-o", "json")

    def settled() -> ChartOperator | None:
        peers = json.loads(release.cluster.kubectl(*peering_cmd).stdout).get("status") or {}
        identities = [op.identity(peers) for op in replicas]
        if None in identities or len(peers) != len(replicas):
            return None
        top = max(peers, key=lambda identity: peers[identity]["priority"])
        active = [op for op in replicas if op.active()]
        return active[0] if [op.identity(peers) for op in active] == [top] else None

    return wait_until(settled, timeout=30, what="exactly the top-priority replica to be active")


def whoami(cluster: Cluster, kubeconfig: Path) -> str:
    return subprocess.run([str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "auth", "whoami",
                           "-o", "jsonpath={.status.userInfo.username}"], capture_output=True, text=True,
                          check=True).stdout


def test_operator_with_the_chart_service_account_runs_a_job(
    chart_operator: ChartOperator, cluster: Cluster, namespace: str
) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", name="demo", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=60)
    assert cluster.kubectl("-n", namespace, "get", "configmap", "demo-config", check=False).returncode == 0
    assert cluster.kubectl("-n", namespace, "get", "service", "demo", check=False).returncode == 0
    (job,) = items(cluster, namespace, "jobs", "finetune.dev/job-name=demo")
    assert job["metadata"]["name"] == "demo-1"
    (pod,) = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")
    pod_name = pod["metadata"]["name"]

    # A progress report: TLS with the chart's certificate, TokenReview and pod lookup under chart RBAC.
    token = cluster.kubectl("-n", namespace, "create", "token", "default", "--audience",
                            f"finetune.dev/progress/{namespace}/demo", "--bound-object-kind", "Pod",
                            "--bound-object-name", pod_name).stdout.strip()
    ca = base64.b64decode(chart_operator.secret["data"]["ca.crt"])
    assert post_progress(chart_operator.ports["progress"], ca, namespace, "demo", token) == 200
    wait_until(lambda: (json.loads(cluster.kubectl("-n", namespace, "get", "ftj", "demo", "-o", "json").stdout)
                        .get("status", {}).get("progress", {}).get("step") == 3),
               timeout=20, what="status.progress.step == 3")

    cluster.kubectl("-n", namespace, "annotate", "pod", pod_name, "kwok.finetune.dev/hold-")
    wait_phase(cluster, namespace, "Succeeded", timeout=60)


def test_helm_test_hook_script_drives_a_job_to_succeeded(
    chart_operator: ChartOperator, helm: Helm, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    release = chart_operator.release
    # `helm test` creates the hook objects; KWOK only plays the pod, so its script is run here, as
    # the hook's ServiceAccount, with the job file from the hook's ConfigMap.
    helm.run("test", release.release, "--namespace", namespace, "--timeout", "2m", kubeconfig=cluster.kubeconfig)
    test_name = f"{release.fullname}-test"
    data = json.loads(cluster.kubectl("-n", namespace, "get", "configmap", test_name, "-o", "json").stdout)["data"]
    (tmp_path / "run.py").write_text(data["run.py"])
    (tmp_path / "finetunejob.yaml").write_text(data["finetunejob.yaml"])
    kubeconfig = token_kubeconfig(cluster, namespace, test_name, tmp_path / "test-kubeconfig")
    assert whoami(cluster, kubeconfig) == f"system:serviceaccount:{namespace}:{test_name}"
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    for run in (1, 2):  # the second run replaces the job the first one left behind
        proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "finetunejob.yaml")],
                              env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"run {run}: {proc.stdout}\n{proc.stderr}"
        assert "phase=Succeeded" in proc.stdout, proc.stdout


def test_replicas_peer_one_active_one_standby(
    chart_operators: list[ChartOperator], cluster: Cluster, namespace: str
) -> None:
    assert len(chart_operators) == 2  # the chart's default
    # The random priorities differ, so exactly one replica is active and the other waits.
    active = active_replica(chart_operators)
    (standby,) = [op for op in chart_operators if op is not active]
    apply(cluster, namespace, ftj("tiny-cpu", name="demo", run_seconds=1))
    wait_phase(cluster, namespace, "Succeeded", timeout=60)
    assert "demo" in active.log() and "demo" not in standby.log() and not standby.active()
    # The standby takes over when the active one stops (kopf removes itself from the peering on exit).
    active.stop()
    wait_until(standby.active, timeout=60, what="the standby to resume")
    apply(cluster, namespace, ftj("tiny-cpu", name="second", run_seconds=1))
    wait_phase(cluster, namespace, "Succeeded", name="second", timeout=60)
