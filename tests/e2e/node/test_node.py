"""The real node runs what the operator's pods need (hack/cluster/node-up.sh).

Each test runs real containers on the node and checks what the pod itself saw (its termination
message or its log), not only what the API says: a non-root, read-only pod with every volume kind
the trainer uses; graceful deletion; an Indexed Job whose pods find each other by DNS and talk
over TCP; the API server reached through the ``kubernetes`` Service with the pod's own token; a
PersistentVolumeClaim of the default StorageClass whose data outlives its pod. The last test
(slow: about two node starts and three stops) takes the node down and up twice and checks that
every stop leaves the host as it was.

All pods use the node's busybox image, so no image has to be built or pulled.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.conftest import Cluster, wait_until

from .conftest import RealNode, node_down, node_ready, node_up, other_node_users

UID = 65532  # "nonroot", the uid the operator and trainer images run as

# The first test to ask for the node may start it, and on a fresh machine that builds kubelet,
# CoreDNS and the provisioner first (about 12 min on 2 busy cores): more than CI's per-test default.
pytestmark = pytest.mark.timeout(2400)


def apply(cluster: Cluster, namespace: str, *objs: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(objs))


def get(cluster: Cluster, namespace: str, *what: str) -> Any:
    return json.loads(cluster.kubectl("-n", namespace, "get", *what, "-o", "json").stdout)


def finished_pod(cluster: Cluster, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The pod once it is Succeeded or Failed."""

    def probe() -> dict[str, Any] | None:
        pod: dict[str, Any] = get(cluster, namespace, "pod", name)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(probe, timeout=timeout, what=f"pod {name} to finish")


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The terminated state of the pod's only container."""
    state: dict[str, Any] = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    return state


def restricted(**extra: Any) -> dict[str, Any]:
    """A container security context the restricted Pod Security Standard accepts, read-only root."""
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        **extra,
    }


def pod(node: RealNode, name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A one-container busybox pod on the real node running ``script`` under ``sh -c``."""
    container = {
        "name": "main",
        "image": node.busybox_image,
        "command": ["sh", "-c", script],
        "securityContext": restricted(),
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": node.place({"restartPolicy": "Never", "containers": [container], **spec}),
    }


def test_pod_runs_nonroot_read_only_with_volumes_and_reports_exit_code_and_message(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    apply(
        cluster,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"greeting": "hello"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec"}, "stringData": {"value": "s3cret"}},
    )
    script = r"""
        ro=no; touch /probe 2>/dev/null || ro=yes
        echo scratch >/scratch/f
        echo shm >/dev/shm/f
        shm=$(awk '$2 == "/dev/shm" {print $3}' /proc/mounts)
        tok=no; [ -s /var/run/secrets/kubernetes.io/serviceaccount/token ] && tok=yes
        sans=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)
        printf 'uid=%s ro=%s scratch=%s shm=%s:%s cm=%s secret=%s token=%s ns=%s' "$(id -u)" "$ro" \
          "$(cat /scratch/f)" "$shm" "$(cat /dev/shm/f)" "$(cat /config/greeting)" "$SECRET_VALUE" "$tok" "$sans" \
          >/dev/termination-log
        echo "log line from $(hostname)"
        exit 3
    """
    apply(
        cluster,
        namespace,
        pod(
            real_node,
            "once",
            script,
            container={
                "env": [{"name": "SECRET_VALUE", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "value"}}}],
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "cfg", "mountPath": "/config", "readOnly": True},
                ],
            },
            volumes=[
                {"name": "scratch", "emptyDir": {}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                {"name": "cfg", "configMap": {"name": "cfg"}},
            ],
        ),
    )
    done = finished_pod(cluster, namespace, "once")
    assert done["spec"]["nodeName"] == real_node.name
    assert done["status"]["phase"] == "Failed"
    state = terminated(done)
    assert state["exitCode"] == 3
    assert state["message"] == (
        f"uid={UID} ro=yes scratch=scratch shm=tmpfs:shm cm=hello secret=s3cret token=yes ns={namespace}"
    )
    # kubectl logs: the apiserver fetches them from the kubelet (client cert, CA-verified serving cert).
    assert cluster.kubectl("-n", namespace, "logs", "once").stdout == "log line from once\n"


def test_deleted_pod_gets_sigterm_and_stops_within_its_grace_period(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    from kubernetes import client, watch

    script = """
        trap 'echo "got SIGTERM"; exit 0' TERM
        echo ready
        while true; do sleep 1 & wait $!; done
    """
    apply(cluster, namespace, pod(real_node, "sleeper", script, terminationGracePeriodSeconds=60))
    wait_until(
        lambda: "ready" in cluster.kubectl("-n", namespace, "logs", "sleeper", check=False).stdout,
        timeout=120,
        what="sleeper to run",
    )
    v1 = client.CoreV1Api(cluster.api_client())
    start = get(cluster, namespace, "pod", "sleeper")["metadata"]["resourceVersion"]
    # The last status the kubelet writes before the pod goes away says how its container ended:
    # exit 0 from the trap if SIGTERM arrived, 137 if the kubelet had to SIGKILL it after 60 s.
    cluster.kubectl("-n", namespace, "delete", "pod", "sleeper", "--wait=false")
    last: dict[str, Any] | None = None
    events = watch.Watch().stream(  # type: ignore[no-untyped-call]
        v1.list_namespaced_pod, namespace, field_selector="metadata.name=sleeper", resource_version=start,
        timeout_seconds=90,
    )
    for event in events:
        statuses = event["object"].status.container_statuses or []
        if statuses and statuses[0].state.terminated:
            last = statuses[0].state.terminated.to_dict()
        if event["type"] == "DELETED":
            break
    assert last is not None, "the pod went away without reporting its container's end"
    assert last["exit_code"] == 0, last


def test_indexed_job_pods_resolve_each_other_by_hostname_and_connect(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    # Each pod serves its hostname over HTTP and asks its peer for its name at <hostname>.<service>
    # (the resolver's search path: libc, as any program would), looks the peer up by its full
    # name too, then stays until the peer has done the same. busybox's nc speaks the HTTP.
    script = r"""
        me=$(hostname); peer=peers-$((1 - JOB_COMPLETION_INDEX))
        mkdir -p /tmp/www && echo "$me" >/tmp/www/name
        httpd -f -p 8080 -h /tmp/www &
        get() { printf 'GET /%s HTTP/1.0\r\n\r\n' "$2" | nc -w 3 "$1" 8080 2>/dev/null; }
        for i in $(seq 240); do said=$(get "$peer.workers" name | tail -n 1) && [ -n "$said" ] && break; sleep 0.5; done
        fqdn=$(nslookup "$peer.workers.$POD_NAMESPACE.svc.cluster.local" 2>/dev/null |
          awk '/^Name:/ {n=1} n && /^Address/ {print $NF; exit}')
        msg="$me: $peer.workers says=$said fqdn=$fqdn"
        echo "$msg"; printf '%s' "$msg" >/dev/termination-log
        [ "$said" = "$peer" ] || exit 1
        touch /tmp/www/done
        for i in $(seq 240); do get "$peer.workers" done | grep -q ' 200 ' && break; sleep 0.5; done
        sleep 5
    """
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "workers"},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"job-name": "peers"},
            "ports": [{"name": "http", "port": 8080}],
        },
    }
    template = pod(
        real_node,
        "unused",
        script,
        subdomain="workers",
        container={
            "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        },
        volumes=[{"name": "tmp", "emptyDir": {}}],
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "peers"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {"spec": template["spec"]},
        },
    }
    apply(cluster, namespace, service, job)

    def job_finished() -> str | None:
        conds = get(cluster, namespace, "job", "peers")["status"].get("conditions", [])
        done = [c["type"] for c in conds if c["type"] in ("Complete", "Failed") and c["status"] == "True"]
        return done[0] if done else None

    outcome = wait_until(job_finished, timeout=240, what="job peers to finish")
    pods = {p["spec"]["hostname"]: p for p in get(cluster, namespace, "pods", "-l", "job-name=peers")["items"]}
    messages = {name: terminated(p).get("message", "") for name, p in pods.items()}
    assert outcome == "Complete", messages
    assert set(pods) == {"peers-0", "peers-1"}
    for me, peer in (("peers-0", "peers-1"), ("peers-1", "peers-0")):
        ip = pods[peer]["status"]["podIP"]
        assert messages[me] == f"{me}: {peer}.workers says={peer} fqdn={ip}"
        assert pods[me]["spec"]["nodeName"] == real_node.name


def test_pod_reaches_the_api_server_through_the_kubernetes_service_with_its_token(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "prober")
    # What in-cluster config does: KUBERNETES_SERVICE_HOST/PORT, the projected token, and the
    # projected CA, which must vouch for the Service's address (-verify_ip).
    script = r"""
        sa=/var/run/secrets/kubernetes.io/serviceaccount
        status() {
          printf 'GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n' \
            "$1" "$KUBERNETES_SERVICE_HOST" "$(cat $sa/token)" |
            openssl s_client -quiet -connect "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT" \
              -CAfile $sa/ca.crt -verify_ip "$KUBERNETES_SERVICE_HOST" -verify_return_error >/tmp/body 2>/tmp/tls ||
            { cat /tmp/tls; return; }
          awk 'NR == 1 {print $2}' /tmp/body
        }
        v=$(status /version); git=$(sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' /tmp/body)
        p=$(status "/api/v1/namespaces/$POD_NAMESPACE/pods")
        dns=$(nslookup kubernetes.default.svc.cluster.local 2>/dev/null |
          awk '/^Name:/ {n=1} n && /^Address/ {print $NF; exit}')
        printf 'service=%s:%s version=%s git=%s pods=%s dns=%s default-routes=%s' \
          "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" "$v" "$git" "$p" "$dns" \
          "$(ip route | grep -c '^default')" >/dev/termination-log
    """
    apply(
        cluster,
        namespace,
        pod(
            real_node,
            "prober",
            script,
            serviceAccountName="prober",
            container={
                "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            },
            volumes=[{"name": "tmp", "emptyDir": {}}],
        ),
    )
    done = finished_pod(cluster, namespace, "prober")
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)["gitVersion"]
    service = get(cluster, "default", "service", "kubernetes")["spec"]["clusterIP"]
    # ...and the Service's name resolves to it; the pod has no default route (nothing leaves the machine).
    assert terminated(done)["message"] == (
        f"service={service}:443 version=200 git={version} pods=403 dns={service} default-routes=0"
    )


def test_claim_of_the_default_storage_class_binds_and_keeps_data_across_pods(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    token = uuid.uuid4().hex
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "checkpoints"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}},
        },
    )

    def with_claim(script: str) -> dict[str, Any]:
        return pod(
            real_node,
            "user",
            script,
            container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "checkpoints"}}],
        )

    apply(cluster, namespace, with_claim(f"echo {token} >/data/step-1 && printf written >/dev/termination-log"))
    first = finished_pod(cluster, namespace, "user", timeout=180)
    assert (first["status"]["phase"], terminated(first).get("message")) == ("Succeeded", "written")
    claim = get(cluster, namespace, "pvc", "checkpoints")
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["storageClassName"] == real_node.storage_class
    pv = get(cluster, namespace, "pv", claim["spec"]["volumeName"])
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert [real_node.name] == [v for t in terms for e in t["matchExpressions"] for v in e["values"]]

    cluster.kubectl("-n", namespace, "delete", "pod", "user", "--wait=true")
    apply(cluster, namespace, with_claim("printf %s \"$(cat /data/step-1)\" >/dev/termination-log"))
    second = finished_pod(cluster, namespace, "user")
    assert (second["status"]["phase"], terminated(second).get("message")) == ("Succeeded", token)


def test_image_from_a_docker_archive_is_loaded_and_runs(
    cluster: Cluster, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    # A new image handed over the way `make images` does: built with buildah (here on top of the
    # node's busybox archive), saved as a docker archive, imported with hack/cluster/node-load.sh.
    assert real_node.busybox_archive, "node.env has no BUSYBOX_ARCHIVE: restart the node (make node-down node-up)"
    ref = f"localhost/ftjob-test/hello:{uuid.uuid4().hex[:8]}"
    buildah = ["buildah", "--root", str(tmp_path / "storage"), "--runroot", str(tmp_path / "run"),
               "--storage-driver", "vfs"]

    def run(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout.strip()

    container = run(*buildah, "from", "--quiet", f"oci-archive:{real_node.busybox_archive}")
    run(*buildah, "config", "--env", "GREETING=hello from a loaded image", container)
    run(*buildah, "commit", "--quiet", container, f"docker-archive:{tmp_path / 'hello.tar'}:{ref}")
    run(*buildah, "rm", container)
    assert real_node.load(tmp_path / "hello.tar") == [ref]
    try:
        apply(cluster, namespace, pod(real_node, "hello", 'printf %s "$GREETING" >/dev/termination-log',
                                      container={"image": ref}))
        done = finished_pod(cluster, namespace, "hello")
        assert (done["status"]["phase"], terminated(done).get("message")) == ("Succeeded", "hello from a loaded image")
    finally:
        cluster.kubectl("-n", namespace, "delete", "pod", "hello", "--wait=true", check=False)
        subprocess.run(["ctr", "--address", str(real_node.containerd_sock), "-n", "k8s.io", "images", "rm", ref],
                       capture_output=True, check=False)


# --- the host is left as found -------------------------------------------------------------------


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


def _iptables(save: str) -> list[str]:
    """iptables-save output without comments and packet counters."""
    return [re.sub(r"\[\d+:\d+\]", "[0:0]", line) for line in _run(save).splitlines() if not line.startswith("#")]


def host_state(node: RealNode) -> dict[str, Any]:
    """What a node could leave behind on the host, in a form that compares equal when nothing did."""
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    processes = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(node.state_dir) in cmdline or "containerd-shim" in cmdline:
            processes.append(cmdline)
    fixed = ["/run/netns", "/run/containerd", "/var/lib/cni", "/var/log/containers", "/var/log/pods",
             "/opt/containerd", "/var/lib/kubelet", "/etc/cni/net.d"]
    sysctls = ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
               "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
               "net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables"]
    return {
        "iptables": _iptables("iptables-save"),
        "ip6tables": _iptables("ip6tables-save"),
        "links": sorted(re.findall(r"^\d+: ([^:@]+)", _run("ip", "-o", "link", "show"), re.M)),
        "addresses": sorted(" ".join(line.split()[1:4]) for line in _run("ip", "-o", "addr", "show").splitlines()),
        "routes": sorted(_run("ip", "route", "show").splitlines()),
        "mounts": sorted(line.split()[4] for line in mountinfo),
        "paths": {p: sorted(x.name for x in Path(p).iterdir()) if Path(p).is_dir() else None for p in fixed},
        "kubepods cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")),
        "sysctls": {k: Path("/proc/sys", k).read_text().strip() for k in sysctls if Path("/proc/sys", k).exists()},
        "node processes": sorted(processes),
        "state": sorted(p.name for p in node.state_dir.iterdir()) if node.state_dir.exists() else [],
    }


@pytest.mark.node_restart
def test_two_down_up_cycles_leave_the_host_as_found(cluster: Cluster, real_node: RealNode) -> None:
    """Slow (two node starts, three stops). Runs last in the session: a restart loses loaded images."""
    cluster_dir = cluster.kubeconfig.parent
    if others := other_node_users(cluster_dir):
        pytest.skip(f"pytest sessions {', '.join(others)} use the real node; restarting it would break them")
    node_down(cluster_dir)
    before = host_state(real_node)
    assert before["node processes"] == [] and before["state"] in ([], ["logs"]), before
    try:
        for _ in range(2):
            node_up(cluster_dir)
            assert node_ready(cluster) == real_node.name
            up = host_state(real_node)  # the snapshot does see a node: its processes, veth and route
            assert up["node processes"] and up["links"] != before["links"] and up["routes"] != before["routes"]
            node_down(cluster_dir)
            after = host_state(real_node)
            diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
            assert not diff, diff
            nodes = cluster.kubectl("get", "node", real_node.name, "--ignore-not-found", "-o", "name").stdout
            assert nodes == "", "node-down left the Node object"
    finally:
        node_up(cluster_dir)  # the session's other users expect the node
