"""The whole product in real containers: the chart's operator, a fake Hub in a pod, and FineTuneJobs that train.

What the end-to-end tests share, whichever cluster runs them. A suite supplies one fixture, `e2e_cluster`, a
`ProductCluster`: how to reach the cluster (kubeconfig, kubectl, helm), the two images built from this checkout,
and where pods must go to run for real (`Placement`). On the local control plane most nodes are KWOK fakes, where
a pod only pretends to run, so every pod of these tests carries the real node's selector and toleration; on kind
every node is real and the placement is empty. Everything else is built here on top of it:

* `operator_release` (module): `helm install` of charts/finetune-operator with the local images, one replica,
  watching one fresh namespace for jobs (namespaced mode: an operator under test never touches other tests'
  jobs), the `hf-token` Secret there; uninstalled and both namespaces deleted at the end.
* `fake_hub` (module): tests/fixtures/hub_server.py in a ConfigMap, run by the trainer image's python in a pod
  behind a Service: a real HTTP server speaking the Hub's commit API, whose model-info endpoint lists what was
  pushed (read back with `kubectl exec`, which works wherever the pod runs).
* `ftjob` (per test): applies FineTuneJobs (`tiny_job` builds the spec: the built-in tiny model and dataset, so
  nothing is downloaded) with a checkpoint PVC on the default StorageClass, streams every trainer pod's log to
  files as soon as it starts (the operator deletes a failed attempt's pods, and their logs with them), waits
  with deadlines, and on a failed test prints the job's status, its pods, the namespace's events, the operator's
  log and each trainer log. It deletes its jobs and PVCs afterwards.

Waits are bounded and name what they waited for; `FTJOB_E2E_TIMEOUT_SCALE` multiplies every deadline (a slow
machine, or one shared with other work).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from finetune_operator.policy import PodPolicy

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "finetune-operator"
HUB_SERVER = REPO / "tests" / "fixtures" / "hub_server.py"

GROUP_VERSION = ("finetune.dev", "v1alpha1")
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_VALUE = "hf_e2e_token_for_the_fake_hub"
HUB_NAME = "fake-hub"
HUB_PORT = 8080
RENDEZVOUS_PORT = 29517
TRAINER_CONTAINER = "trainer"
TIMEOUT_SCALE = float(os.environ.get("FTJOB_E2E_TIMEOUT_SCALE", "1"))

T = TypeVar("T")


def log(message: str) -> None:
    """Progress on stderr (visible with `pytest -s`, and in the report of a failed test)."""
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def deadline(seconds: float) -> float:
    """A monotonic deadline `seconds` from now, scaled by FTJOB_E2E_TIMEOUT_SCALE."""
    return time.monotonic() + seconds * TIMEOUT_SCALE


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 2.0,
             explain: Callable[[], str] | None = None) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and, if given, `explain()`."""
    end = deadline(timeout)
    last: T | None = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    detail = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout * TIMEOUT_SCALE:.0f}s waiting for {what} (last: {last!r}){detail}")


# --------------------------------------------------------------------------------------------------------------
# The cluster abstraction
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Node selector and tolerations every pod of the product needs in order to run on a real node."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    def pod_fields(self) -> dict[str, Any]:
        """The pod-spec keys (camelCase, as in a manifest and in FineTuneJob `spec.template`)."""
        out: dict[str, Any] = {}
        if self.node_selector:
            out["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            out["tolerations"] = [dict(t) for t in self.tolerations]
        return out


@dataclass(frozen=True)
class Image:
    """An image reference split the way the chart takes it."""

    repository: str
    tag: str

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @classmethod
    def parse(cls, ref: str) -> Image:
        repository, _, tag = ref.rpartition(":")
        if not repository or "/" in tag:
            raise ValueError(f"image {ref!r} has no tag")
        return cls(repository, tag)


@dataclass
class ProductCluster:
    """A cluster whose pods really run, with this checkout's images available to its nodes."""

    description: str  # "the local control plane's real node", "kind cluster ftjob-e2e"
    kubeconfig: Path
    kubectl_bin: Path
    helm_bin: Path
    operator_image: Image
    trainer_image: Image
    placement: Placement = field(default_factory=Placement)
    # Node the product's pods must land on (None: any node is real).
    node_name: str | None = None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raise with its output on a non-zero exit when `check`."""
        cmd = [str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout: {proc.stdout[-4000:]}\nstderr: {proc.stderr[-4000:]}")
        return proc

    def kubectl_bytes(self, *args: str, timeout: float = 120.0) -> bytes:
        """kubectl's stdout as bytes (a file read with `kubectl exec`)."""
        cmd = [str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()[-4000:]}")
        return proc.stdout

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ARGS -o json`, decoded."""
        out: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return out

    def get_or_none(self, *args: str) -> dict[str, Any] | None:
        proc = self.kubectl("get", *args, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)}: {proc.stderr}")
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def helm(self, *args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster, with its caches in /tmp (nothing written to the home directory)."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": "/tmp/ftjob-helm/cache",
               "HELM_CONFIG_HOME": "/tmp/ftjob-helm/config", "HELM_DATA_HOME": "/tmp/ftjob-helm/data"}
        proc = subprocess.run([str(self.helm_bin), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout: {proc.stdout[-4000:]}\nstderr: {proc.stderr[-4000:]}")
        return proc

    def create_namespace(self, prefix: str) -> str:
        """A fresh namespace whose default ServiceAccount exists (pods can be created at once)."""
        name = f"{prefix}-{uuid.uuid4().hex[:5]}"
        self.kubectl("create", "namespace", name)
        wait_for(lambda: self.get_or_none("-n", name, "serviceaccount", "default"), timeout=60,
                 what=f"the default ServiceAccount in {name}", interval=0.5)
        return name

    def delete_namespace(self, name: str) -> None:
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)


def namespace_report(cluster: ProductCluster, namespace: str) -> str:
    """Pods (wide), their container states and the events of a namespace: why something there is not Ready."""
    pods = cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False)
    states = cluster.kubectl("-n", namespace, "get", "pods", "-o",
                             "jsonpath={range .items[*]}{.metadata.name}: {.status.containerStatuses[*].state}{'\\n'}"
                             "{end}", check=False)
    events = cluster.kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False)
    return (f"--- pods in {namespace} ---\n{pods.stdout}{pods.stderr}\n{states.stdout}\n"
            f"--- events in {namespace} ---\n{events.stdout[-6000:]}")


# --------------------------------------------------------------------------------------------------------------
# The operator, installed with the chart
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Release:
    """The chart installed by `operator_release`: where the operator runs and which namespace it watches."""

    cluster: ProductCluster
    name: str
    namespace: str
    jobs_namespace: str
    values: dict[str, Any]

    @property
    def fullname(self) -> str:
        return f"{self.name}-finetune-operator"

    def operator_pods(self) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/name=finetune-operator"
        items: list[dict[str, Any]] = self.cluster.get("-n", self.namespace, "pods", "-l", selector)["items"]
        return [p for p in items if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "test"]

    def operator_log(self, tail: int = 200) -> str:
        proc = self.cluster.kubectl("-n", self.namespace, "logs", f"deployment/{self.fullname}", f"--tail={tail}",
                                    check=False)
        return proc.stdout + proc.stderr

    def operator_metrics(self) -> str:
        """The operator's /metrics, read inside its own pod (its image has python)."""
        pod = self.operator_pods()[0]["metadata"]["name"]
        port = self.values.get("metrics", {}).get("port", 9090)
        script = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
        return self.cluster.kubectl("-n", self.namespace, "exec", pod, "-c", "operator", "--", "python", "-c",
                                    script).stdout


def release_values(cluster: ProductCluster, jobs_namespace: str) -> dict[str, Any]:
    """Chart values for the local images (the names are a contract: README.md uses the same ones)."""
    values: dict[str, Any] = {
        "image": {"repository": cluster.operator_image.repository, "tag": cluster.operator_image.tag,
                  "pullPolicy": "Never"},
        "trainer": {"image": cluster.trainer_image.ref},
        "replicas": 1,
        "watchNamespaces": [jobs_namespace],
        "test": {"namespace": jobs_namespace},
    }
    if cluster.placement.node_selector:
        values["nodeSelector"] = dict(cluster.placement.node_selector)
    if cluster.placement.tolerations:
        values["tolerations"] = [dict(t) for t in cluster.placement.tolerations]
        # The pod policy lets a job's template tolerate only the taints it names: the defaults plus the node's.
        keys = [t["key"] for t in cluster.placement.tolerations]
        values["podPolicy"] = {"allowedTolerations": list(dict.fromkeys([*PodPolicy().allowed_tolerations, *keys]))}
    return values


def install_release(cluster: ProductCluster, tmp: Path) -> Release:
    """Namespaces, CRDs, `helm install --wait`, the hf-token Secret; the operator Ready."""
    jobs_namespace = cluster.create_namespace("ftjob-e2e")
    namespace = cluster.create_namespace("ftjob-e2e-system")
    name = f"e2e{uuid.uuid4().hex[:5]}"
    values = release_values(cluster, jobs_namespace)
    release = Release(cluster, name, namespace, jobs_namespace, values)
    # Helm never upgrades CRDs it finds installed; apply the chart's own so the cluster has this checkout's.
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=e2e-tests", "-f", str(crd))
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    log(f"helm install {name} on {cluster.description} into {namespace} (jobs in {jobs_namespace}) with {values}")
    started = time.monotonic()
    try:
        cluster.helm("install", name, str(CHART), "--namespace", namespace, "--values", str(values_file),
                     "--wait", "--timeout", f"{int(300 * TIMEOUT_SCALE)}s", timeout=420 * TIMEOUT_SCALE)
        log(f"operator Ready {time.monotonic() - started:.0f}s after helm install")
        cluster.kubectl("-n", jobs_namespace, "create", "secret", "generic", HF_TOKEN_SECRET,
                        f"--from-literal=token={HF_TOKEN_VALUE}")
    except (AssertionError, subprocess.TimeoutExpired) as e:
        report = namespace_report(cluster, namespace)
        uninstall_release(release)
        raise AssertionError(f"{e}\n{report}") from e
    return release


def uninstall_release(release: Release) -> None:
    cluster = release.cluster
    cluster.helm("uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", "120s",
                 timeout=180, check=False)
    cluster.delete_namespace(release.jobs_namespace)
    cluster.delete_namespace(release.namespace)


@pytest.fixture(scope="module")
def operator_release(e2e_cluster: ProductCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart installed once per test module (installs are the slow part); see the module docstring."""
    release = install_release(e2e_cluster, tmp_path_factory.mktemp("release"))
    try:
        yield release
    finally:
        uninstall_release(release)


# --------------------------------------------------------------------------------------------------------------
# The fake Hub in a pod
# --------------------------------------------------------------------------------------------------------------


@dataclass
class FakeHub:
    """tests/fixtures/hub_server.py serving in the cluster at `endpoint` (a Service's DNS name)."""

    cluster: ProductCluster
    namespace: str
    pod: str

    @property
    def endpoint(self) -> str:
        return f"http://{HUB_NAME}.{self.namespace}.svc:{HUB_PORT}"

    def _get(self, path: str) -> bytes:
        """GET on the Hub from inside its own pod (`kubectl exec`: no route from here to a pod needed)."""
        script = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    sys.stdout.buffer.write(urllib.request.urlopen('http://127.0.0.1:{HUB_PORT}' + sys.argv[1]).read())\n"
            "except urllib.error.HTTPError as e:\n"
            "    sys.exit(f'HTTP {e.code}: {e.read().decode()}')\n"
        )
        return self.cluster.kubectl_bytes("-n", self.namespace, "exec", self.pod, "-c", "hub", "--", "python", "-c",
                                          script, path)

    def model_info(self, repo_id: str) -> dict[str, Any]:
        """`{"id", "private", "commits", "siblings": [{"rfilename", "size", "sha256"}]}` of a pushed repo."""
        info: dict[str, Any] = json.loads(self._get(f"/api/models/{repo_id}"))
        return info

    def file(self, repo_id: str, path: str) -> bytes:
        return self._get(f"/{repo_id}/resolve/main/{path}")


def hub_manifests(cluster: ProductCluster, namespace: str) -> list[dict[str, Any]]:
    """ConfigMap with the server's source, a restricted pod running it with the trainer image, a Service."""
    labels = {"app.kubernetes.io/name": HUB_NAME}
    endpoint = f"http://{HUB_NAME}.{namespace}.svc:{HUB_PORT}"
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": HUB_NAME, "namespace": namespace},
         "data": {"hub_server.py": HUB_SERVER.read_text()}},
        {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": HUB_NAME, "namespace": namespace, "labels": labels},
            "spec": {
                **cluster.placement.pod_fields(),
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "hub",
                    "image": cluster.trainer_image.ref,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "/opt/hub/hub_server.py", "--host", "0.0.0.0", "--port", str(HUB_PORT),
                                "--endpoint", endpoint],
                    "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                    "ports": [{"name": "http", "containerPort": HUB_PORT}],
                    "readinessProbe": {"tcpSocket": {"port": HUB_PORT}, "periodSeconds": 2},
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "512Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "source", "mountPath": "/opt/hub", "readOnly": True}],
                }],
                "volumes": [{"name": "source", "configMap": {"name": HUB_NAME}}],
            },
        },
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": HUB_NAME, "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": HUB_PORT, "targetPort": HUB_PORT}]}},
    ]


@pytest.fixture(scope="module")
def fake_hub(operator_release: Release) -> FakeHub:
    """The fake Hub in the jobs namespace, Ready (deleted with that namespace)."""
    cluster, namespace = operator_release.cluster, operator_release.jobs_namespace
    cluster.apply(*hub_manifests(cluster, namespace))
    proc = cluster.kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{HUB_NAME}",
                           f"--timeout={int(180 * TIMEOUT_SCALE)}s", check=False, timeout=240 * TIMEOUT_SCALE)
    if proc.returncode != 0:
        raise AssertionError(f"the fake Hub pod is not Ready: {proc.stderr}\n{namespace_report(cluster, namespace)}")
    return FakeHub(cluster, namespace, HUB_NAME)


# --------------------------------------------------------------------------------------------------------------
# FineTuneJobs
# --------------------------------------------------------------------------------------------------------------


def tiny_job(
    name: str,
    *,
    placement: Placement,
    claim: str,
    hub: FakeHub | None = None,
    nodes: int = 2,
    max_steps: int = 10,
    save_steps: int = 5,
    max_restarts: int = 0,
    backoff_limit: int = 3,
    text_field: str = "content",
) -> dict[str, Any]:
    """A FineTuneJob that trains the built-in tiny Llama on CPU, one process per pod, DeepSpeed ZeRO-3, c10d.

    Small requests (the real node may have only two cores); every step logged, so each one reaches the progress
    endpoint and the log; checkpoints on the PVC `claim`, shared by the pods (they run on one node, so a
    ReadWriteOnce volume serves them all); the adapter pushed once, at the end, to `hub`.
    """
    output: dict[str, Any] = {"checkpoints": {"persistentVolumeClaim": {"claimName": claim}}}
    if hub is not None:
        output["hub"] = {"repoId": f"e2e/{name}", "endpoint": hub.endpoint, "strategy": "end", "private": True,
                         "tokenSecretRef": {"name": HF_TOKEN_SECRET, "key": "token"}}
    return {
        "apiVersion": "/".join(GROUP_VERSION),
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "builtin:tiny-llama", "attnImplementation": "sdpa"},
            "dataset": {"name": "builtin:tiny-chat", "splits": ["train"], "textField": text_field,
                        "maxSeqLen": 128, "packing": True},
            "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "targetModules": "all-linear"},
            "training": {"maxSteps": max_steps, "learningRate": 3.0e-3, "lrSchedulerType": "constant",
                         "perDeviceTrainBatchSize": 4, "gradientAccumulationSteps": 1,
                         "gradientCheckpointing": False, "mixedPrecision": "no", "loggingSteps": 1,
                         "evalStrategy": "no", "saveStrategy": "steps", "saveSteps": save_steps},
            "distributed": {"nodes": nodes, "gpusPerNode": 0, "processesPerNode": 1,
                            "deepspeed": {"zeroStage": 3},
                            "rendezvous": {"backend": "c10d", "port": RENDEZVOUS_PORT, "timeoutSeconds": 300,
                                           "maxRestarts": max_restarts}},
            "output": output,
            "runPolicy": {"backoffLimit": backoff_limit},
            "template": {
                **placement.pod_fields(),
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}},
                "shmSize": "256Mi",
            },
        },
    }


def pvc(name: str, storage_class: str | None = None) -> dict[str, Any]:
    """A ReadWriteOnce claim on the default StorageClass (or `storage_class`)."""
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


# Lines the trainer logs (finetune_trainer.__main__, .checkpoints, .progress) that the tests read.
RESUMING = re.compile(r"resuming from \S*/checkpoint-(\d+)")
FRESH_START = re.compile(r"fresh start \(no complete checkpoint")
CHECKPOINT_COMPLETE = re.compile(r"checkpoint checkpoint-(\d+) complete")
SIGTERM_SAVE = re.compile(r"SIGTERM: saving a checkpoint at step (\d+)")
SIGTERM_STOPPED = re.compile(r"stopped by SIGTERM at step (\d+)")
STEP = re.compile(r"\bstep (\d+)/(\d+) ")
TRAINER_START = re.compile(r"job (\S+)/(\S+): (\d+) processes on (\d+) machines")
PERMANENT = re.compile(r"permanent error \(exit (\d+)\): (.*)")
ADAPTER_WRITTEN = re.compile(r"adapter written to (\S+)")


def ints(pattern: re.Pattern[str], text: str) -> list[int]:
    """The first group of every match, as ints, in order."""
    return [int(m.group(1)) for m in pattern.finditer(text)]


@dataclass
class _Follow:
    """One pod's log streams: each (re)start writes a new file, and the longest one is the log."""

    pod: str
    uid: str
    paths: list[Path] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    def text(self) -> str:
        texts = [p.read_text(errors="replace") for p in self.paths if p.exists()]
        return max(texts, key=len, default="")


class PodLogs:
    """Every container log of a job's pods, streamed to files from the moment each container starts.

    A thread lists the job's pods every second and runs `kubectl logs -f` for each started one; a stream that
    ends while its pod still seemed to run (a dropped connection) is restarted from the beginning into a new
    file, and the longest file counts (a restart after the pod is gone holds only an error, not a shorter log).
    Pod names carry the attempt (`<job>-<attempt>-<index>-<suffix>`).
    """

    def __init__(self, cluster: ProductCluster, namespace: str, job: str, directory: Path) -> None:
        self.cluster, self.namespace, self.job, self.dir = cluster, namespace, job, directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._follows: dict[str, _Follow] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> last seen pod (attempt, index, node)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"logs-{job}", daemon=True)

    def start(self) -> PodLogs:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            for follow in self._follows.values():
                if follow.proc is not None and follow.proc.poll() is None:
                    follow.proc.terminate()
                    try:
                        follow.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        follow.proc.kill()
                        follow.proc.wait()

    def _list(self) -> list[dict[str, Any]]:
        proc = self.cluster.kubectl("-n", self.namespace, "get", "pods", "-l", f"finetune.dev/job-name={self.job}",
                                    "-o", "json", check=False, timeout=30)
        if proc.returncode != 0:
            return []
        items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
        return items

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except (subprocess.SubprocessError, OSError, ValueError) as e:
                log(f"log follower for {self.job}: {e}")
            self._stop.wait(1.0)

    def poll(self) -> None:
        """Start (or restart) a stream for each started container."""
        for pod in self._list():
            meta, status = pod["metadata"], pod.get("status", {})
            uid, name = meta["uid"], meta["name"]
            self._pods[uid] = pod
            states = [c.get("state", {}) for c in status.get("containerStatuses", [])]
            started = any("running" in s or "terminated" in s for s in states)
            if not started:
                continue
            with self._lock:
                follow = self._follows.get(uid)
                if follow is None:
                    follow = self._follows[uid] = _Follow(name, uid)
                running = any("running" in s for s in states)
                if follow.proc is None or (follow.proc.poll() is not None and running):
                    path = self.dir / f"{name}.{len(follow.paths)}.log"
                    follow.paths.append(path)
                    out = open(path, "wb")  # noqa: SIM115 - handed to the child, closed below
                    try:
                        follow.proc = subprocess.Popen(
                            [str(self.cluster.kubectl_bin), "--kubeconfig", str(self.cluster.kubeconfig), "-n",
                             self.namespace, "logs", "-f", name, "-c", TRAINER_CONTAINER],
                            stdout=out, stderr=subprocess.STDOUT)
                    finally:
                        out.close()

    def pods(self) -> list[dict[str, Any]]:
        """Every pod of the job seen so far (the last state seen), oldest first."""
        return sorted(self._pods.values(), key=lambda p: p["metadata"]["creationTimestamp"])

    def by_pod(self) -> dict[str, str]:
        """Pod name -> its log so far."""
        with self._lock:
            follows = list(self._follows.values())
        return {f.pod: f.text() for f in follows}

    def of(self, *, attempt: int, index: int | None = None) -> str:
        """The logs of one attempt's pods (one pod when `index` is given), concatenated."""
        prefix = f"{self.job}-{attempt}-" if index is None else f"{self.job}-{attempt}-{index}-"
        return "\n".join(text for pod, text in sorted(self.by_pod().items()) if pod.startswith(prefix))


@dataclass
class JobRun:
    """One FineTuneJob under test and what has been learned about it."""

    runner: FineTuneJobs
    name: str
    logs: PodLogs

    @property
    def cluster(self) -> ProductCluster:
        return self.runner.cluster

    @property
    def namespace(self) -> str:
        return self.runner.namespace

    def get(self) -> dict[str, Any]:
        return self.cluster.get("-n", self.namespace, "finetunejob", self.name)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.get().get("status") or {}
        return status

    def wait_phase(self, *phases: str, timeout: float = 900) -> dict[str, Any]:
        """Wait until the job's phase is one of `phases`; fail at once on another terminal phase."""
        last: tuple[Any, ...] = ()
        end = deadline(timeout)
        while time.monotonic() < end:
            status = self.status()
            progress = status.get("progress") or {}
            now = (status.get("phase"), status.get("attempt"), progress.get("step"))
            if now != last:
                last = now
                log(f"{self.name}: phase={now[0]} attempt={now[1]} step={now[2]} loss={progress.get('loss')}")
            if status.get("phase") in phases:
                return status
            if status.get("phase") in ("Succeeded", "Failed"):
                raise AssertionError(f"{self.name} ended {status.get('phase')}, expected {phases}\n{self.report()}")
            time.sleep(2)
        raise AssertionError(f"{self.name} not {'/'.join(phases)} after {timeout * TIMEOUT_SCALE:.0f}s\n"
                             f"{self.report()}")

    def wait_log(self, pattern: re.Pattern[str], *, attempt: int, index: int | None = None,
                 timeout: float = 600, what: str = "") -> re.Match[str]:
        """Wait for `pattern` in one attempt's logs; return the first match."""
        def probe() -> re.Match[str] | None:
            self._fail_if_finished_early()
            return pattern.search(self.logs.of(attempt=attempt, index=index))

        return wait_for(probe, timeout=timeout, what=what or f"{pattern.pattern!r} in attempt {attempt}'s log",
                        interval=1.0, explain=self.report)

    def _fail_if_finished_early(self) -> None:
        phase = (self.status()).get("phase")
        if phase in ("Succeeded", "Failed"):
            raise AssertionError(f"{self.name} is already {phase} (the test wanted it still running)\n{self.report()}")

    def pods(self, attempt: int | None = None) -> list[dict[str, Any]]:
        """The job's pods that exist now (of one attempt), by completion index."""
        selector = f"finetune.dev/job-name={self.name}"
        if attempt is not None:
            selector += f",finetune.dev/attempt={attempt}"
        items = self.cluster.get("-n", self.namespace, "pods", "-l", selector)["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def pod(self, *, attempt: int, index: int) -> dict[str, Any]:
        """The running pod of one attempt and completion index."""
        def probe() -> dict[str, Any] | None:
            for p in self.pods(attempt):
                labels = p["metadata"].get("labels", {})
                if (labels.get("batch.kubernetes.io/job-completion-index") == str(index)
                        and p.get("status", {}).get("phase") == "Running"):
                    return p
            return None

        return wait_for(probe, timeout=300, what=f"pod {index} of attempt {attempt} Running", explain=self.report)

    def events(self) -> str:
        proc = self.cluster.kubectl("-n", self.namespace, "get", "events", "--sort-by=.lastTimestamp", check=False)
        return proc.stdout[-6000:]

    def report(self) -> str:
        """What a person needs to see why a wait failed: status, pods, events, operator and trainer logs."""
        parts: list[str] = []
        obj = self.cluster.get_or_none("-n", self.namespace, "finetunejob", self.name)
        parts.append("--- FineTuneJob status ---\n" + yaml.safe_dump((obj or {}).get("status") or {}))
        table = self.cluster.kubectl("-n", self.namespace, "get", "pods", "-o", "wide", check=False)
        parts.append("--- pods ---\n" + table.stdout + table.stderr)
        for pod in self.pods():
            for c in pod.get("status", {}).get("containerStatuses", []):
                parts.append(f"{pod['metadata']['name']}/{c['name']}: {json.dumps(c.get('state'))}")
        parts.append("--- events ---\n" + self.events())
        parts.append("--- operator log (tail) ---\n" + self.runner.release.operator_log(tail=80))
        for name, text in sorted(self.logs.by_pod().items()):
            parts.append(f"--- {name} log (tail) ---\n" + text[-5000:])
        return "\n".join(parts)


class FineTuneJobs:
    """Creates jobs in the release's namespace; deletes them (and their PVCs) at the end of the test."""

    def __init__(self, release: Release, hub: FakeHub, tmp: Path) -> None:
        self.release, self.hub, self.tmp = release, hub, tmp
        self.cluster, self.namespace = release.cluster, release.jobs_namespace
        self.runs: list[JobRun] = []
        self.claims: list[str] = []

    def claim(self, name: str) -> str:
        """A fresh ReadWriteOnce PVC (bound when the first pod using it is scheduled, with local-path)."""
        obj = pvc(name)
        obj["metadata"]["namespace"] = self.namespace
        self.cluster.apply(obj)
        self.claims.append(name)
        return name

    def create(self, job: dict[str, Any]) -> JobRun:
        name = job["metadata"]["name"]
        job = {**job, "metadata": {**job["metadata"], "namespace": self.namespace}}
        logs = PodLogs(self.cluster, self.namespace, name, self.tmp / name).start()
        run = JobRun(self, name, logs)
        self.runs.append(run)
        self.cluster.apply(job)
        log(f"created FineTuneJob {self.namespace}/{name}")
        return run

    def cleanup(self, failed: bool) -> None:
        for run in self.runs:
            if failed:
                log(f"test failed; what {run.name} left behind:\n{run.report()}")
            run.logs.stop()
            self.cluster.kubectl("-n", self.namespace, "delete", "finetunejob", run.name, "--ignore-not-found",
                                 "--wait=true", "--timeout=120s", check=False, timeout=180)
        for claim in self.claims:
            self.cluster.kubectl("-n", self.namespace, "delete", "pvc", claim, "--ignore-not-found", "--wait=false",
                                 check=False)


@pytest.fixture
def ftjob(operator_release: Release, fake_hub: FakeHub, request: pytest.FixtureRequest) -> Iterator[FineTuneJobs]:
    """Per test: create jobs and PVCs; on a failed test print each job's report; then delete them."""
    failed_before = request.session.testsfailed
    with tempfile.TemporaryDirectory(prefix="ftjob-e2e-logs-") as tmp:
        jobs = FineTuneJobs(operator_release, fake_hub, Path(tmp))
        try:
            yield jobs
        finally:
            jobs.cleanup(failed=request.session.testsfailed > failed_before)


def exec_python(cluster: ProductCluster, namespace: str, pod: str, script: str, *args: str) -> str:
    """Run a Python snippet in a pod's trainer container; its stdout."""
    return cluster.kubectl("-n", namespace, "exec", pod, "-c", TRAINER_CONTAINER, "--", "python", "-c", script,
                           *args).stdout


# Finds the training worker among the pod's processes (launcher -> accelerate/torchrun agent -> worker):
# the worker's argv is `python -u -m finetune_trainer --config ...`; the others name a launch module.
KILL_WORKER = """
import os, signal, sys
killed = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        argv = [a.decode() for a in open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0') if a]
    except OSError:
        continue
    if 'finetune_trainer' in argv and '--config' in argv and not any('launch' in a for a in argv):
        os.kill(int(pid), signal.SIGKILL)
        killed.append(f'{pid} {" ".join(argv)}')
print('\\n'.join(killed))
sys.exit(0 if len(killed) == 1 else 3)
"""


def safetensors_header(data: bytes) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    length = int.from_bytes(data[:8], "little")
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    return header


def assert_pods_ran_on(cluster: ProductCluster, pods: Sequence[dict[str, Any]]) -> None:
    """Every pod ran on the cluster's real node (when it has one), not on a fake one."""
    if cluster.node_name is None:
        return
    nodes = {p["metadata"]["name"]: p.get("spec", {}).get("nodeName") for p in pods}
    assert set(nodes.values()) == {cluster.node_name}, f"pods not on the real node {cluster.node_name}: {nodes}"
