"""health.pod_problem and pods_health: what the scheduler and the kubelet wrote into a pod's status, as a problem.

The statuses below are real ones, copied from pods on the local cluster (Kubernetes 1.35.4: kube-scheduler
for the unschedulable ones, a kubelet with containerd on the real node for the others), with the fields no
rule reads (volumeMounts, containerID, imageID, probe times) left out. The eviction is the kubelet's eviction
manager's shape (status reason `Evicted`, its message, a DisruptionTarget condition), which a test machine
cannot trigger on demand; the KWOK-style OOM kill is what the control-plane tests write (no `resources` in
the container status, so the limit comes from the spec).
"""

from typing import Any

import pytest

from finetune_operator.health import (
    HEALTHY_REASON,
    MESSAGE_LIMIT,
    PodProblem,
    pod_problem,
    pods_health,
)

BUSYBOX = "localhost/ftjob/busybox:1.35.0-4-deb12u1-b1-openssl-3.0.19-1-deb12u2"
NOT_LOADED = "localhost/finetune-operator/not-loaded:v0"
SCHEDULED = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T19:20:41Z"}
NOT_READY = [
    {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-12-01T19:20:45Z"},
    {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T19:20:41Z"},
    {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
     "message": "containers with unready status: [trainer]", "lastTransitionTime": "2026-12-01T19:20:41Z"},
    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
     "message": "containers with unready status: [trainer]", "lastTransitionTime": "2026-12-01T19:20:41Z"},
    SCHEDULED,
]  # fmt: skip


def pod(status: dict[str, Any], *, memory: str | None = None, node: str | None = "ftjob-node") -> dict[str, Any]:
    """A pod with one container `trainer` (memory limit `memory`) and the given status."""
    resources = {"limits": {"memory": memory}} if memory else {}
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "image": BUSYBOX, "resources": resources}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "demo-1-0"}, "spec": spec, "status": status}


def unschedulable(message: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                 "lastTransitionTime": "2026-12-01T19:20:40Z", "observedGeneration": 1}  # fmt: skip
    return pod({"phase": "Pending", "conditions": [condition]}, node=None)


def waiting(reason: str, message: str | None, image: str = BUSYBOX) -> dict[str, Any]:
    state = {"waiting": {"reason": reason, **({"message": message} if message is not None else {})}}
    container = {"name": "trainer", "image": image, "lastState": {}, "ready": False, "restartCount": 0,
                 "started": False, "state": state}  # fmt: skip
    return pod({"phase": "Pending", "conditions": NOT_READY, "containerStatuses": [container]})


GPU_MESSAGE = (
    "0/5 nodes are available: 1 node(s) had untolerated taint(s), 4 Insufficient nvidia.com/gpu. no new claims to "
    "deallocate, preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling."
)
SELECTOR_MESSAGE = (
    "0/5 nodes are available: 1 node(s) had untolerated taint(s), 4 node(s) didn't match Pod's node "
    "affinity/selector. no new claims to deallocate, preemption: 0/5 nodes are available: 5 Preemption is not "
    "helpful for scheduling."
)
PVC_MESSAGE = '0/5 nodes are available: persistentvolumeclaim "ft-ckpt-shared" not found. not found'
PULL_MESSAGE = (
    f'failed to pull and unpack image "{NOT_LOADED}": failed to resolve reference "{NOT_LOADED}": failed to do '
    'request: Head "http://localhost/v2/finetune-operator/not-loaded/manifests/v0": dial tcp 127.0.0.1:80: '
    "connect: connection refused"
)
EVICTION_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. Container trainer was "
    "using 61Gi, request is 0, has larger consumption of memory. "
)

OOM_REAL = pod(
    {
        "phase": "Failed",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": "2026-12-01T19:20:53Z"},
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T19:20:41Z"},
            {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": "2026-12-01T19:20:51Z"},
            {"type": "ContainersReady", "status": "False", "reason": "PodFailed",
             "lastTransitionTime": "2026-12-01T19:20:51Z"},
            SCHEDULED,
        ],
        "containerStatuses": [
            {"allocatedResources": {"memory": "32Mi"}, "image": BUSYBOX, "lastState": {}, "name": "trainer",
             "ready": False, "resources": {"limits": {"memory": "32Mi"}, "requests": {"memory": "32Mi"}},
             "restartCount": 0, "started": False,
             "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-12-01T19:20:44Z",
                                      "finishedAt": "2026-12-01T19:20:50Z"}}},
        ],
    },
    memory="32Mi",
)  # fmt: skip


def terminated(reason: str, exit_code: int, *, memory: str | None = None, phase: str = "Failed") -> dict[str, Any]:
    """A container that ended, as KWOK-backed tests write it (no `resources` in the container status)."""
    state = {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": "2026-12-01T19:20:44Z",
                            "finishedAt": "2026-12-01T19:20:50Z"}}  # fmt: skip
    container = {"name": "trainer", "image": BUSYBOX, "ready": False, "restartCount": 0, "state": state}
    return pod({"phase": phase, "containerStatuses": [container]}, memory=memory)


CRASH_LOOP = pod(
    {
        "phase": "Running",
        "conditions": NOT_READY,
        "containerStatuses": [
            {"image": BUSYBOX, "name": "trainer", "ready": False, "resources": {}, "restartCount": 3,
             "started": False,
             "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "startedAt": "2026-12-01T19:21:25Z",
                                          "finishedAt": "2026-12-01T19:21:25Z"}},
             "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed "
                       "container=trainer pod=crashloop_health-probe(a619688b-7f80-470a-a10c-89c378b1959e)"}}},
        ],
    }
)  # fmt: skip
EVICTED = pod(
    {
        "phase": "Failed",
        "reason": "Evicted",
        "message": EVICTION_MESSAGE,
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
             "message": EVICTION_MESSAGE, "lastTransitionTime": "2026-12-01T19:30:00Z"},
            SCHEDULED,
        ],
        "containerStatuses": [
            {"name": "trainer", "image": BUSYBOX, "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 137, "reason": "Error"}}},
        ],
    }
)  # fmt: skip
RUNNING = pod(
    {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}, SCHEDULED],
        "containerStatuses": [
            {"image": BUSYBOX, "lastState": {}, "name": "trainer", "ready": True, "resources": {}, "restartCount": 0,
             "started": True, "state": {"running": {"startedAt": "2026-12-01T19:24:11Z"}}},
        ],
    }
)  # fmt: skip

CASES = [
    # (id, pod, expected problem or None)
    ("a nodeSelector no node matches: the scheduler's message", unschedulable(SELECTOR_MESSAGE),
     PodProblem("Unschedulable", SELECTOR_MESSAGE)),
    ("more GPUs than any node has, and a tainted node", unschedulable(GPU_MESSAGE),
     PodProblem("Unschedulable", GPU_MESSAGE)),
    ("a checkpoint claim that does not exist: the scheduler names it", unschedulable(PVC_MESSAGE),
     PodProblem("Unschedulable", PVC_MESSAGE)),
    ("an image the node cannot pull, with the image and the runtime's error",
     waiting("ErrImagePull", PULL_MESSAGE, NOT_LOADED),
     PodProblem("ErrImagePull", f'container trainer, image "{NOT_LOADED}": {PULL_MESSAGE}')),
    ("the pull backing off", waiting("ImagePullBackOff", f'Back-off pulling image "{NOT_LOADED}": ErrImagePull: '
                                     f"{PULL_MESSAGE}", NOT_LOADED),
     PodProblem("ImagePullBackOff",
                f'container trainer, image "{NOT_LOADED}": Back-off pulling image "{NOT_LOADED}": ErrImagePull: '
                f"{PULL_MESSAGE}")),
    ("an image that is not on the node with imagePullPolicy Never",
     waiting("ErrImageNeverPull", f'Container image "{NOT_LOADED}" is not present with pull policy of Never',
             NOT_LOADED),
     PodProblem("ErrImageNeverPull", f'container trainer, image "{NOT_LOADED}": Container image "{NOT_LOADED}" is '
                "not present with pull policy of Never")),
    ("an image name the runtime cannot parse",
     waiting("InvalidImageName", 'Failed to apply default image tag "localhost/UPPER/Case:v0": couldn\'t parse image '
             'name "localhost/UPPER/Case:v0": invalid reference format: repository name (UPPER/Case) must be '
             "lowercase", "localhost/UPPER/Case:v0"),
     PodProblem("InvalidImageName", 'container trainer, image "localhost/UPPER/Case:v0": Failed to apply default '
                'image tag "localhost/UPPER/Case:v0": couldn\'t parse image name "localhost/UPPER/Case:v0": invalid '
                "reference format: repository name (UPPER/Case) must be lowercase")),
    ("an env secretKeyRef to a Secret that does not exist",
     waiting("CreateContainerConfigError", 'secret "hf-token" not found'),
     PodProblem("CreateContainerConfigError", 'container trainer: secret "hf-token" not found')),
    ("an envFrom to a ConfigMap that does not exist",
     waiting("CreateContainerConfigError", 'configmap "no-such-cm" not found'),
     PodProblem("CreateContainerConfigError", 'container trainer: configmap "no-such-cm" not found')),
    ("an OOM kill with the limit the kubelet reports", OOM_REAL,
     PodProblem("OOMKilled", "container trainer was killed for using more than its memory limit of 32Mi")),
    ("an OOM kill with the limit from the spec", terminated("OOMKilled", 137, memory="64Gi"),
     PodProblem("OOMKilled", "container trainer was killed for using more than its memory limit of 64Gi")),
    ("an OOM kill without a memory limit", terminated("OOMKilled", 137),
     PodProblem("OOMKilled", "container trainer was killed for running out of memory (it has no memory limit: "
                "the node ran out)")),
    ("a crash loop with the last exit", CRASH_LOOP,
     PodProblem("CrashLoopBackOff", "container trainer keeps failing (3 restart(s)); last exit code 3 (Error)")),
    ("an eviction by the kubelet, with its message", EVICTED, PodProblem("Evicted", EVICTION_MESSAGE.strip())),
    ("a running pod", RUNNING, None),
    ("a pod still creating its container (a volume that cannot mount is only an event)",
     waiting("ContainerCreating", None), None),
    ("a pod that just succeeded", terminated("Completed", 0, phase="Succeeded"), None),
    ("an ordinary failure is the attempt's, not a pod health problem", terminated("Error", 1), None),
    ("a pod stopped by its deletion (exit 143)", terminated("Error", 143), None),
    ("a pod held by a scheduling gate (Kueue) waits by design",
     pod({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                             "message": "Scheduling is blocked due to non-empty scheduling gates"}]},
         node=None), None),
    ("a pod with no status yet", {"metadata": {"name": "demo-1-0"}, "spec": {}}, None),
]  # fmt: skip


@pytest.mark.parametrize(("pod", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pod_problem(pod: dict[str, Any], expected: PodProblem | None) -> None:
    assert pod_problem(pod) == expected


def test_a_pod_failed_as_a_whole_outranks_its_container_state() -> None:
    # An evicted pod's container was killed too: the eviction, not the exit, is what the user must read.
    assert pod_problem(EVICTED) == PodProblem("Evicted", EVICTION_MESSAGE.strip())
    evicted_oom = {**EVICTED, "status": {**EVICTED["status"], **terminated("OOMKilled", 137)["status"],
                                         "phase": "Failed"}}  # fmt: skip
    assert pod_problem(evicted_oom) == PodProblem("Evicted", EVICTION_MESSAGE.strip())


def test_a_crash_loop_after_an_oom_kill_names_the_limit() -> None:
    status = CRASH_LOOP["status"]
    last = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    container = {**status["containerStatuses"][0], "lastState": last}
    looping = pod({**status, "containerStatuses": [container]}, memory="8Gi")
    problem = pod_problem(looping)
    assert problem == PodProblem(
        "CrashLoopBackOff",
        "container trainer keeps failing (3 restart(s)); last time: container trainer was killed for using more "
        "than its memory limit of 8Gi",
    )


def test_a_long_scheduler_message_is_clipped_to_one_line() -> None:
    long = "0/500 nodes are available: " + ", ".join(f"1 node(s) had untolerated taint {{k{i}: v}}" for i in range(99))
    problem = pod_problem(unschedulable(long + "\n"))
    assert problem is not None and problem.message.endswith("...") and "\n" not in problem.message
    assert len(problem.message) == 1024


def test_healthy_pods_give_a_true_condition() -> None:
    health = pods_health([("demo-1-0", None), ("demo-1-1", None)])
    assert (health.healthy, health.status, health.reason) == (True, "True", HEALTHY_REASON)


def test_pods_with_the_same_problem_are_named_together_and_the_worst_problem_gives_the_reason() -> None:
    stuck = PodProblem("Unschedulable", SELECTOR_MESSAGE)
    oom = PodProblem("OOMKilled", "container trainer was killed for using more than its memory limit of 64Gi")
    health = pods_health([("demo-1-2", stuck), ("demo-1-0", stuck), ("demo-1-1", oom), ("demo-1-3", None)])
    assert (health.healthy, health.status, health.reason) == (False, "False", "OOMKilled")
    assert health.message == f"pod demo-1-1: {oom.text}; pods demo-1-0, demo-1-2: Unschedulable: {SELECTOR_MESSAGE}"


def test_many_pods_are_counted_not_listed() -> None:
    stuck = PodProblem("Unschedulable", GPU_MESSAGE)
    health = pods_health([(f"demo-1-{i}", stuck) for i in range(8)])
    assert health.message == f"pods demo-1-0, demo-1-1, demo-1-2 and 5 more: Unschedulable: {GPU_MESSAGE}"


def test_the_message_stays_within_its_limit_and_says_how_many_problems_it_left_out() -> None:
    problems = [(f"demo-1-{i}", PodProblem("CreateContainerConfigError", f"{i} " + "x" * 1000)) for i in range(10)]
    health = pods_health(problems)
    assert len(health.message) <= MESSAGE_LIMIT
    assert health.message.count("CreateContainerConfigError") == 3
    assert health.message.endswith("(and 7 more problem(s))")
