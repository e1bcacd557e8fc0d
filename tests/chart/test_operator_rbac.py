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
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.operator.conftest import apply, free_port, ftj, items, wait_phase

from .conftest import Cluster, wait_until

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


def test_operator_with_the_chart_service_account_runs_a_job(
    install: Any, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    release = install(namespace, {"watchNamespaces": [namespace]})
    sa_name = release.fullname
    deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment", release.fullname,
                                            "-o", "json").stdout)
    secret = json.loads(cluster.kubectl("-n", namespace, "get", "secret", f"{release.fullname}-progress-tls",
                                        "-o", "json").stdout)
    ports = {"liveness": free_port(), "progress": free_port(), "metrics": free_port()}
    command = local_command(deployment, tmp_path, secret, ports)
    env = {
        **os.environ,
        "KUBECONFIG": str(token_kubeconfig(cluster, namespace, sa_name, tmp_path / "kubeconfig")),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "POD_ID": "chart-test-operator",
    }
    whoami = subprocess.run([str(cluster.bin_dir / "kubectl"), "--kubeconfig", env["KUBECONFIG"], "auth", "whoami",
                             "-o", "jsonpath={.status.userInfo.username}"], capture_output=True, text=True, check=True)
    assert whoami.stdout == release.sa  # the operator below is this ServiceAccount, not admin
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def live() -> bool:
            assert proc.poll() is None, f"operator exited {proc.returncode}:\n{log_path.read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports['liveness']}/healthz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(live, timeout=60, interval=0.2, what="operator liveness")
        apply(cluster, namespace, ftj("tiny-cpu", name="demo", hold=True))
        wait_phase(cluster, namespace, "Running", timeout=60)
        assert cluster.kubectl("-n", namespace, "get", "configmap", "demo-config", check=False).returncode == 0
        assert cluster.kubectl("-n", namespace, "get", "service", "demo", check=False).returncode == 0
        (job,) = items(cluster, namespace, "jobs", "finetune.dev/job-name=demo")
        (pod,) = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")
        pod_name = pod["metadata"]["name"]

        # A progress report: TLS with the chart's certificate, TokenReview and pod lookup under chart RBAC.
        token = cluster.kubectl("-n", namespace, "create", "token", "default", "--audience",
                                f"finetune.dev/progress/{namespace}/demo", "--bound-object-kind", "Pod",
                                "--bound-object-name", pod_name).stdout.strip()
        ca = base64.b64decode(secret["data"]["ca.crt"])
        assert post_progress(ports["progress"], ca, namespace, "demo", token) == 200
        wait_until(lambda: (json.loads(cluster.kubectl("-n", namespace, "get", "ftj", "demo", "-o", "json").stdout)
                            .get("status", {}).get("progress", {}).get("step") == 3),
                   timeout=20, what="status.progress.step == 3")

        cluster.kubectl("-n", namespace, "annotate", "pod", pod_name, "kwok.finetune.dev/hold-")
        wait_phase(cluster, namespace, "Succeeded", timeout=60)
        assert job["metadata"]["name"] == "demo-1"
        log = log_path.read_text(errors="replace")
        assert not [line for line in log.splitlines() if any(m in line for m in FORBIDDEN_MARKS)], log[-5000:]
    except BaseException:
        sys.stderr.write(f"\n--- operator log ---\n{log_path.read_text(errors='replace')[-20000:]}\n")
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
