"""The whole product end to end in real containers: the chart's operator in a pod, FineTuneJobs that really train.

On the local control plane (hack/cluster) with its real node (`make node-up`: kubelet + containerd, labelled
`finetune.dev/real-node: "true"` and tainted so that only pods asking for it land there; every other node is a
KWOK fake on which nothing runs) and this checkout's images (`make images`). The same test functions run on kind
(tests/e2e/kind imports them and supplies its own `e2e_cluster`). What each test shows:

* the operator runs as a pod of the chart's Deployment under the chart's ServiceAccount: in-cluster credentials,
  no kubeconfig, no host network;
* a 2-node CPU job (ZeRO-3, c10d rendezvous through the headless Service's DNS names) trains, its progress
  reaches `status.progress` through the operator's HTTPS progress endpoint, it ends Succeeded, and the adapter is
  pushed to a Hub-compatible server in the cluster, where the pushed files are read back;
* a trainer pod deleted with grace 0 fails the attempt; the operator starts attempt 2, which resumes from the
  newest complete checkpoint on the PVC;
* the training process SIGKILLed inside a pod is a transient worker crash, absorbed inside the pods by torch
  elastic (the design: `rendezvous.maxRestarts`): same attempt, same pods, the restarted workers resume from the
  newest complete checkpoint;
* SIGTERM with the pod's grace period (`kubectl delete pod`) saves a checkpoint at the step where it arrived,
  and the next attempt resumes from exactly that step;
* a permanent trainer error (a dataset without the text field) fails the job after one attempt with the
  trainer's reason, and torch elastic does not retry it even with `maxRestarts: 3`.

Jobs are small (tens of steps of a 2-layer model, one process per pod) and run one at a time; the chart is
installed once per module. Each test has its own deadline (`pytest.mark.timeout`, above CI's per-test default,
because the first one also pays for the node, the images and the install: on a cold 2-core machine about
30 min to build the node's binaries and 10 min to build, export and load the images).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import time

import pytest

from tests.controlplane.conftest import Cluster
from tests.e2e.node.conftest import RealNode
from tests.e2e.node.product import (
    CHECKPOINT_COMPLETE,
    FRESH_START,
    KILL_WORKER,
    PERMANENT,
    REPO,
    RESUMING,
    SIGTERM_SAVE,
    SIGTERM_STOPPED,
    STEP,
    TRAINER_START,
    FakeHub,
    FineTuneJobs,
    Image,
    Placement,
    ProductCluster,
    Release,
    assert_pods_ran_on,
    exec_python,
    fake_hub,
    ftjob,
    ints,
    log,
    operator_release,
    safetensors_header,
    tiny_job,
)

__all__ = ["fake_hub", "ftjob", "operator_release"]  # fixtures, used by name

pytestmark = [pytest.mark.node, pytest.mark.timeout(5400)]

TRAINER_PODS = 2


def local_image(name: str) -> Image:
    """An image `make images` builds: localhost/finetune-operator/<name>:dev (FTJOB_IMAGE_REPO, FTJOB_IMAGE_TAG)."""
    repo = os.environ.get("FTJOB_IMAGE_REPO", "localhost/finetune-operator")
    return Image(f"{repo}/{name}", os.environ.get("FTJOB_IMAGE_TAG", "dev"))


@pytest.fixture(scope="module")
def e2e_cluster(cluster: Cluster, real_node: RealNode) -> ProductCluster:
    """The local control plane with its real node, and this checkout's images in the node's containerd.

    `hack/images.sh` (what `make images` runs) builds what changed (seconds when nothing did) and loads the
    images into the node unless it already holds them; a restarted node has lost them, so this runs every time.
    """
    started = time.monotonic()
    proc = subprocess.run([str(REPO / "hack" / "images.sh"), "operator", "trainer"], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise AssertionError(f"hack/images.sh failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    log(f"images ready in the node in {time.monotonic() - started:.0f}s:\n{proc.stdout.strip()}")
    (key, value), (taint_key, taint_value, effect) = real_node.label, real_node.taint
    return ProductCluster(
        description=f"the local control plane's real node {real_node.name}",
        kubeconfig=cluster.kubeconfig,
        kubectl_bin=cluster.bin_dir / "kubectl",
        helm_bin=cluster.bin_dir / "helm",
        operator_image=local_image("operator"),
        trainer_image=local_image("trainer"),
        placement=Placement({key: value}, [{"key": taint_key, "operator": "Equal", "value": taint_value,
                                            "effect": effect}]),
        node_name=real_node.name,
    )


# ------------------------------------------------------------------------------------------------------------
# a. the operator, as the chart runs it
# ------------------------------------------------------------------------------------------------------------


def test_operator_runs_in_a_pod_under_the_charts_service_account(operator_release: Release) -> None:
    release, cluster = operator_release, operator_release.cluster
    pods = release.operator_pods()
    assert len(pods) == 1, f"expected one operator pod (replicas: 1), got {[p['metadata']['name'] for p in pods]}"
    pod = pods[0]
    spec, status = pod["spec"], pod["status"]
    assert spec["serviceAccountName"] == release.fullname
    assert not spec.get("hostNetwork"), "the operator must not run in the host's network namespace"
    assert_pods_ran_on(cluster, pods)
    (container,) = [c for c in spec["containers"] if c["name"] == "operator"]
    assert container["image"] == cluster.operator_image.ref and container["imagePullPolicy"] == "Never"
    assert f"--namespace={release.jobs_namespace}" in container["args"]
    assert f"--image={cluster.trainer_image.ref}" in container["args"]
    # In-cluster credentials only: the ServiceAccount token volume, no kubeconfig in env, args or volumes.
    assert "KUBECONFIG" not in {e["name"] for e in container.get("env", [])}
    assert not any("kubeconfig" in a.lower() for a in container.get("args", []) + container.get("command", []))
    secrets = sorted(v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v)
    assert secrets == [f"{release.fullname}-progress-tls"], f"secret volumes: {secrets}"
    tokens = [s for v in spec["volumes"] for s in v.get("projected", {}).get("sources", [])
              if "serviceAccountToken" in s]
    assert tokens, "no ServiceAccount token volume: the operator could not reach the API server in-cluster"
    (cstatus,) = status["containerStatuses"]
    assert cstatus["ready"] and cstatus["restartCount"] == 0, f"operator container: {cstatus}"
    # The identity it runs with may not read Secrets (the API server's own answer).
    user = f"system:serviceaccount:{release.namespace}:{release.fullname}"
    answer = cluster.kubectl("auth", "can-i", "get", "secrets", "-n", release.jobs_namespace, "--as", user,
                             check=False).stdout.strip()
    assert answer == "no", f"{user} can read Secrets: {answer}"


# ------------------------------------------------------------------------------------------------------------
# b. two nodes train, report progress, push the adapter
# ------------------------------------------------------------------------------------------------------------


def test_two_node_job_trains_reports_progress_and_pushes_the_adapter(
    ftjob: FineTuneJobs, fake_hub: FakeHub, operator_release: Release
) -> None:
    cluster, ns, name, steps = ftjob.cluster, ftjob.namespace, "tiny-2node", 10
    claim = ftjob.claim(f"{name}-ckpt")
    run = ftjob.create(tiny_job(name, placement=cluster.placement, claim=claim, hub=fake_hub, max_steps=steps,
                                save_steps=5))
    status = run.wait_phase("Succeeded", timeout=1500)
    assert status.get("attempt") == 1, f"a clean run needs one attempt: {status}"

    # Two pods, one per completion index, on the real node; node 0 is reached by its headless-Service name.
    pods = run.logs.pods()
    assert len(pods) == TRAINER_PODS, [p["metadata"]["name"] for p in pods]
    assert sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert_pods_ran_on(cluster, pods)
    service = cluster.get("-n", ns, "service", name)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    for pod in pods:
        command = pod["spec"]["containers"][0]["command"]
        assert command[command.index("--main_process_ip") + 1] == f"{name}-1-0.{name}.{ns}.svc", command
        assert command[command.index("--rdzv_backend") + 1] == "c10d", command
    rank0 = run.logs.of(attempt=1, index=0)
    start = TRAINER_START.search(rank0)
    assert start and (start.group(3), start.group(4)) == ("2", "2"), f"no 2-process, 2-machine start:\n{rank0[-3000:]}"
    assert ints(STEP, rank0)[-1] == steps, rank0[-3000:]

    # Progress came through the operator's HTTPS endpoint, authenticated with the pod's projected token.
    progress = status["progress"]
    assert progress["step"] == steps and progress.get("totalSteps") == steps, progress
    assert isinstance(progress.get("loss"), float) and math.isfinite(progress["loss"]), progress
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    progress_service = f"https://{operator_release.fullname}-progress.{operator_release.namespace}.svc:"
    assert (env.get("FTJOB_PROGRESS_URL") or "").startswith(progress_service), env
    token_sources = [s["serviceAccountToken"] for v in pods[0]["spec"]["volumes"]
                     for s in v.get("projected", {}).get("sources", []) if "serviceAccountToken" in s]
    assert any(t.get("audience") for t in token_sources), f"no audience-bound token volume: {token_sources}"
    accepted = re.search(r'^finetune_progress_pushes_total\{result="accepted"\} (\S+)$',
                         operator_release.operator_metrics(), re.MULTILINE)
    assert accepted and float(accepted.group(1)) >= 1, "the operator's progress endpoint accepted no report"

    # The adapter went to the Hub in the cluster, and status.output points there.
    repo = f"e2e/{name}"
    output = status.get("output") or {}
    assert output.get("hubRepo") == repo, output
    assert (output.get("url") or "").startswith(f"{fake_hub.endpoint}/{repo}/commit/"), output
    assert output.get("revision") and output["revision"] in output["url"], output
    info = fake_hub.model_info(repo)
    files = {s["rfilename"]: s for s in info["siblings"]}
    log(f"pushed to {repo}: {sorted(files)}; commits {info['commits']}")
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(files), sorted(files)
    assert info["private"] is True and info["commits"] == [f"{name}: adapter after step {steps}"], info
    config = json.loads(fake_hub.file(repo, "adapter_config.json"))
    assert config["peft_type"] == "LORA" and config["r"] == 8, config
    weights = fake_hub.file(repo, "adapter_model.safetensors")
    assert hashlib.sha256(weights).hexdigest() == files["adapter_model.safetensors"]["sha256"]
    tensors = [k for k in safetensors_header(weights) if k != "__metadata__"]
    assert any("lora_A" in k for k in tensors) and any("lora_B" in k for k in tensors), tensors[:10]
    card = fake_hub.file(repo, "README.md").decode()
    assert "library_name: peft" in card and "hf_e2e" not in card, card[:2000]


# ------------------------------------------------------------------------------------------------------------
# c. a pod lost mid-run, and a worker killed inside a pod
# ------------------------------------------------------------------------------------------------------------


def test_deleted_trainer_pod_restarts_the_gang_from_the_newest_checkpoint(ftjob: FineTuneJobs) -> None:
    """`kubectl delete pod --grace-period=0 --force`: the pod object is gone at once and backoffLimit 0 fails the
    attempt's Job; the operator deletes that Job and starts attempt 2, which resumes from the newest complete
    checkpoint. The kubelet still stops the containers with SIGTERM and its 2-second minimum grace, so the
    trainer may or may not manage a SIGTERM checkpoint in that time (the tiny model usually does): the resumed
    step is the newest checkpoint attempt 1 completed, whichever that was."""
    cluster, ns, name, steps, every = ftjob.cluster, ftjob.namespace, "tiny-podkill", 40, 5
    claim = ftjob.claim(f"{name}-ckpt")
    run = ftjob.create(tiny_job(name, placement=cluster.placement, claim=claim, max_steps=steps, save_steps=every))
    first = int(run.wait_log(CHECKPOINT_COMPLETE, attempt=1, index=0, timeout=900).group(1))
    victim = run.pod(attempt=1, index=1)["metadata"]["name"]
    at_kill = max(ints(STEP, run.logs.of(attempt=1, index=0)))
    log(f"checkpoint-{first} complete; deleting {victim} with grace 0 at step {at_kill}")
    cluster.kubectl("-n", ns, "delete", "pod", victim, "--grace-period=0", "--force")

    status = run.wait_phase("Succeeded", timeout=1500)
    assert status["attempt"] == 2, f"the lost pod should cost exactly one restart: {status}"
    attempt1, attempt2 = run.logs.of(attempt=1, index=0), run.logs.of(attempt=2, index=0)
    resumed, complete = ints(RESUMING, attempt2), ints(CHECKPOINT_COMPLETE, attempt1)
    log(f"attempt 1: checkpoints {complete} (SIGTERM on the way out: {ints(SIGTERM_SAVE, attempt1)}), last step "
        f"logged {max(ints(STEP, attempt1))}; attempt 2 resumed from {resumed}")
    assert len(resumed) == 1, f"attempt 2 should resume once:\n{attempt2[-3000:]}"
    assert resumed[0] >= first > 0, (resumed, complete)
    # The newest complete one: the last checkpoint attempt 1 finished before it died, none it had not reached.
    assert resumed[0] == max(complete) and resumed[0] <= max(ints(STEP, attempt1)), (resumed, complete)
    assert ints(STEP, attempt2)[0] == resumed[0] + 1 and ints(STEP, attempt2)[-1] == steps
    assert status["progress"]["step"] == steps


def test_sigkilled_training_process_is_restarted_in_its_pod_by_torch_elastic(ftjob: FineTuneJobs) -> None:
    """A worker crash with the pods intact is what torch elastic absorbs (design: transient worker crashes stay
    inside the pods, `rendezvous.maxRestarts`): both agents re-rendezvous and restart their workers, which resume
    from the newest complete checkpoint. The Job never fails, so the operator starts no second attempt."""
    cluster, ns, name, steps, every = ftjob.cluster, ftjob.namespace, "tiny-sigkill", 40, 5
    claim = ftjob.claim(f"{name}-ckpt")
    run = ftjob.create(tiny_job(name, placement=cluster.placement, claim=claim, max_steps=steps, save_steps=every,
                                max_restarts=3))
    first = int(run.wait_log(CHECKPOINT_COMPLETE, attempt=1, index=0, timeout=900).group(1))
    pods_before = {p["metadata"]["uid"] for p in run.pods(attempt=1)}
    victim = run.pod(attempt=1, index=0)["metadata"]["name"]
    killed = exec_python(cluster, ns, victim, KILL_WORKER)
    log(f"checkpoint-{first} complete; SIGKILLed in {victim}: {killed.strip()}")

    status = run.wait_phase("Succeeded", timeout=1500)
    assert status["attempt"] == 1, f"torch elastic should have absorbed the crash without a new attempt: {status}"
    seen = run.logs.pods()
    assert {p["metadata"]["uid"] for p in seen} == pods_before, "pods were replaced"
    rank0 = run.logs.of(attempt=1, index=0)
    starts, resumed, complete = TRAINER_START.findall(rank0), ints(RESUMING, rank0), ints(CHECKPOINT_COMPLETE, rank0)
    log(f"rank 0 started {len(starts)} times, resumed from {resumed}, checkpoints {complete}")
    assert len(starts) == 2, f"one start and one in-pod restart expected:\n{rank0[-4000:]}"
    assert len(FRESH_START.findall(rank0)) == 1 and len(resumed) == 1, rank0[-4000:]
    assert resumed[0] > 0 and resumed[0] % every == 0 and resumed[0] >= first, (resumed, complete)
    assert status["progress"]["step"] == steps


# ------------------------------------------------------------------------------------------------------------
# d. SIGTERM: checkpoint on the way out
# ------------------------------------------------------------------------------------------------------------


def test_sigterm_saves_a_checkpoint_that_the_next_attempt_resumes_from(ftjob: FineTuneJobs) -> None:
    """No periodic checkpoints (saveSteps beyond maxSteps), so the one attempt 2 resumes from can only be the one
    written on SIGTERM."""
    cluster, ns, name, steps = ftjob.cluster, ftjob.namespace, "tiny-sigterm", 40
    claim = ftjob.claim(f"{name}-ckpt")
    run = ftjob.create(tiny_job(name, placement=cluster.placement, claim=claim, max_steps=steps, save_steps=1000))
    run.wait_log(re.compile(rf"\bstep ([5-9]|[1-3]\d)/{steps} "), attempt=1, index=0, timeout=900,
                 what="rank 0 past step 5")
    pod = run.pod(attempt=1, index=0)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 60, f"a grace period of {grace}s leaves too little time for one step and one save"
    log(f"deleting {pod['metadata']['name']} with its grace period ({grace}s)")
    cluster.kubectl("-n", ns, "delete", "pod", pod["metadata"]["name"], "--wait=false")

    status = run.wait_phase("Succeeded", timeout=1500)
    attempt1 = run.logs.of(attempt=1)
    saved = ints(SIGTERM_SAVE, attempt1)
    assert len(saved) == 1, f"one SIGTERM checkpoint expected:\n{attempt1[-4000:]}"
    step = saved[0]
    assert ints(CHECKPOINT_COMPLETE, attempt1) == [step], attempt1[-4000:]
    assert set(ints(SIGTERM_STOPPED, attempt1)) == {step}, "every rank stops at the step it saved"
    assert status["attempt"] == 2, status
    attempt2 = run.logs.of(attempt=2, index=0)
    log(f"SIGTERM checkpoint at step {step}; attempt 2 resumed from {ints(RESUMING, attempt2)}")
    assert ints(RESUMING, attempt2) == [step], attempt2[-3000:]
    assert step >= 5 and ints(STEP, attempt2)[0] == step + 1
    assert status["progress"]["step"] == steps


# ------------------------------------------------------------------------------------------------------------
# e. permanent errors are not retried
# ------------------------------------------------------------------------------------------------------------


def test_permanent_error_fails_after_one_attempt_without_elastic_retries(ftjob: FineTuneJobs) -> None:
    cluster, name = ftjob.cluster, "tiny-badfield"
    claim = ftjob.claim(f"{name}-ckpt")
    run = ftjob.create(tiny_job(name, placement=cluster.placement, claim=claim, max_restarts=3,
                                text_field="nosuchfield"))
    status = run.wait_phase("Failed", timeout=900)
    assert status["attempt"] == 1, f"a permanent error must not start another attempt: {status}"
    failed = [c for c in status.get("conditions", []) if c["type"] == "Failed" and c["status"] == "True"]
    assert failed and failed[0]["reason"] == "PermanentError", status.get("conditions")
    message = failed[0]["message"]
    assert "65" in message and "nosuchfield" in message, f"the trainer's reason is not in the status: {message}"
    logs = run.logs.by_pod()
    assert len(logs) == TRAINER_PODS, sorted(logs)
    for pod, text in logs.items():
        # Each pod's trainer started once and failed once: torch elastic (maxRestarts 3) did not run it again.
        errors = PERMANENT.findall(text)
        assert len(errors) == 1 and errors[0][0] == "65", f"{pod}:\n{text[-4000:]}"
    rank0 = run.logs.of(attempt=1, index=0)
    assert len(TRAINER_START.findall(rank0)) == 1, rank0[-4000:]
    exit_codes = [c["state"]["terminated"]["exitCode"] for p in run.pods(attempt=1)
                  for c in p["status"].get("containerStatuses", []) if "terminated" in c.get("state", {})]
    assert 65 in exit_codes, f"container exit codes {exit_codes}"
