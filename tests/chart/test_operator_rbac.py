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
    for key in ("tls.crt", "tls.key"):
        (tmp / key).write_bytes(base64.b64decode(secret["data"][key]))
    local = {
        "--liveness": f"http://127.0.0.1:{ports['liveness']}/healthz",
        "--progress-port": str(ports["progress"]),
        "--metrics-port": str(ports["metrics"]),
        "--progress-cert": str(tmp / "tls.crt"),
        "--progress-key": str(tmp / "tls.key"),
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
    """`ftjob operator` running locally as the chart's ServiceAccount, from the Deployment's command."""

    release: Any
    secret: dict[str, Any]
    ports: dict[str, int]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def chart_operator(install: Any, cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[ChartOperator]:
    release = install(namespace, {"watchNamespaces": [namespace]})
    deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment", release.fullname,
                                            "-o", "json").stdout)
    secret = json.loads(cluster.kubectl("-n", namespace, "get", "secret", f"{release.fullname}-progress-tls",
                                        "-o", "json").stdout)
    ports = {"liveness": free_port(), "progress": free_port(), "metrics": free_port()}
    command = local_command(deployment, tmp_path, secret, ports)
    kubeconfig = token_kubeconfig(cluster, namespace, release.fullname, tmp_path / "kubeconfig")
    assert whoami(cluster, kubeconfig) == release.sa  # the operator below is this ServiceAccount, not admin
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "POD_ID": "chart-test-operator",
    }
    op = ChartOperator(release, secret, ports, tmp_path / "operator.log")
    with op.log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def live() -> bool:
        assert proc.poll() is None, f"operator exited {proc.returncode}:\n{op.log()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['liveness']}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_until(live, timeout=60, interval=0.2, what="operator liveness")
        yield op
        forbidden = [line for line in op.log().splitlines() if any(m in line for m in FORBIDDEN_MARKS)]
        assert not forbidden, "\n".join(forbidden)
    except BaseException:
        sys.stderr.write(f"\n--- operator log ---\n{op.log()[-20000:]}\n")
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


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
