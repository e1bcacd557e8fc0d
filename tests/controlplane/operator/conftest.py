"""Fixtures for operator tests on the real control plane: the CRD, a running `ftjob operator`, helpers.

`operator` starts `ftjob operator --standalone --namespace <test namespace>` as a subprocess (so a
test can SIGKILL it) with its own liveness, progress and metrics ports, and stops it afterwards.
`ftj` builds small FineTuneJobs from `examples/*.yaml` (checkpoints on emptyDir, no nodeSelector,
KWOK pod annotations for how long pods run or how they fail).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.constants import DEFAULT_TRAINER_IMAGE
from finetune_operator.cli import build_parser
from finetune_operator.policy import policy_from_flags

from ..conftest import REPO, Cluster, wait_until

FTJOB = Path(sys.executable).parent / "ftjob"
KWOK = "kwok.finetune.dev"
POLICY_FLAGS = (f"--allowed-annotation-prefix={KWOK}/",)
"""The operator's pod-policy flags here: the defaults, plus the KWOK annotations that say how a test pod runs."""
POLICY = policy_from_flags(build_parser().parse_args(["operator", *POLICY_FLAGS]), image=DEFAULT_TRAINER_IMAGE)
"""The same policy, for rendering a job here as the operator does."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    """The FineTuneJob CRD from crds/finetunejob.yaml, established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "finetunejob.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/finetunejobs.finetune.dev", "--timeout=30s")


@dataclass
class Operator:
    """A running `ftjob operator` subprocess and where it listens."""

    cluster: Cluster
    namespace: str
    log_path: Path
    progress_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    liveness_port: int = field(default_factory=free_port)
    mode: tuple[str, ...] = ("--standalone",)
    policy: tuple[str, ...] = POLICY_FLAGS
    proc: subprocess.Popen[bytes] | None = None
    tmpdir: Path | None = None
    """The process's TMPDIR, removed once it has exited: the Kubernetes client copies the kubeconfig's client key
    into a temp file and deletes it only at a clean exit, so a SIGKILLed operator would leave the key behind."""

    def start(self) -> None:
        """Start it and wait until kopf's liveness endpoint answers (startup handlers done)."""
        args = [
            str(FTJOB), "operator", *self.mode, *self.policy, "--namespace", self.namespace, "--verbose",
            "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--progress-port", str(self.progress_port), "--metrics-port", str(self.metrics_port),
            "--progress-url", f"https://127.0.0.1:{self.progress_port}",
        ]
        self.tmpdir = Path(tempfile.mkdtemp(prefix="ftjob-operator-"))
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig), "TMPDIR": str(self.tmpdir)}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._live, timeout=30, interval=0.2, what="operator liveness")

    def _live(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers, as if the pod's node died."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._remove_tmpdir()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._remove_tmpdir()

    def _remove_tmpdir(self) -> None:
        if self.tmpdir is not None and (self.proc is None or self.proc.poll() is not None):
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())


@pytest.fixture
def operator(cluster: Cluster, crd: None, namespace: str, tmp_path: Path,
             request: pytest.FixtureRequest) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path / "operator.log")
    op.start()
    try:
        yield op
    finally:
        op.stop()
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            sys.stderr.write(f"\n--- operator log ({namespace}) ---\n{op.log()}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def ftj(example: str = "llama-70b-lora-2x8", *, name: str = "demo", run_seconds: float | None = 2.0,
        hold: bool = False, fail: bool = False, exit_code: int | None = None, **run_policy: Any) -> dict[str, Any]:
    """A small variant of examples/<example>.yaml that lands on the KWOK GPU nodes."""
    body = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())
    body = copy.deepcopy(body)
    body["metadata"] = {"name": name}
    spec = body["spec"]
    spec["output"]["checkpoints"] = {"emptyDir": {}}
    template = spec.setdefault("template", {})
    template.pop("nodeSelector", None)
    template.pop("tolerations", None)
    annotations = template.setdefault("annotations", {})
    if run_seconds is not None:
        annotations[f"{KWOK}/run-seconds"] = str(run_seconds)
    if hold:
        annotations[f"{KWOK}/hold"] = "true"
    if fail:
        annotations[f"{KWOK}/fail"] = "true"
    if exit_code is not None:
        annotations[f"{KWOK}/exit-code"] = str(exit_code)
    spec["runPolicy"] = {"backoffLimit": 2, **run_policy}
    return body


def apply(cluster: Cluster, namespace: str, body: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(body))


def get(cluster: Cluster, namespace: str, *what: str) -> Any:
    proc = cluster.kubectl("-n", namespace, "get", *what, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def items(cluster: Cluster, namespace: str, kind: str, selector: str) -> list[dict[str, Any]]:
    found = get(cluster, namespace, kind, "-l", selector)
    return list(found["items"]) if found else []


def status(cluster: Cluster, namespace: str, name: str = "demo") -> dict[str, Any]:
    body = get(cluster, namespace, "finetunejob", name)
    return dict((body or {}).get("status") or {})


def wait_phase(cluster: Cluster, namespace: str, phase: str, *, name: str = "demo", timeout: float = 60,
               seen: list[str] | None = None) -> dict[str, Any]:
    """Poll until status.phase == phase; record every phase passed on the way into `seen`."""

    def probe() -> dict[str, Any] | None:
        st = status(cluster, namespace, name)
        if seen is not None and st.get("phase") and (not seen or seen[-1] != st["phase"]):
            seen.append(st["phase"])
        return st if st.get("phase") == phase else None

    return wait_until(probe, timeout=timeout, interval=0.1, what=f"{namespace}/{name} phase {phase}")


def condition(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def events(cluster: Cluster, namespace: str, name: str = "demo") -> list[dict[str, Any]]:
    found = get(cluster, namespace, "events", "--field-selector", f"involvedObject.name={name}")
    return sorted(found["items"] if found else [], key=lambda e: e.get("lastTimestamp") or "")


def sleep(seconds: float) -> None:
    time.sleep(seconds)
