"""The pod policy, rule by rule: a template in, the whole list of errors out (`check_job` under a policy).

The rules that need no configuration (reserved label keys, a toleration of every taint, env Secret
references) are here too, with the CRD's own path and message; tests/security/test_pod_policy.py
drives the same attacks through a real API server and operator.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.spec import RESERVED_LABELS_MESSAGE, TOLERATE_EVERYTHING_MESSAGE
from finetune_operator.cli import EXIT_INVALID, build_parser, main
from finetune_operator.policy import PodPolicy, image_repository, policy_from_flags
from finetune_operator.render import RenderOptions, render_all
from finetune_operator.validation import check_job
from tests.builders import job_body

DEFAULT = PodPolicy()
ANY_ANNOTATION = PodPolicy(allowed_annotation_prefixes=("*",))
POLICY = "is not allowed by the operator's pod policy"


def template(**fields: Any) -> dict[str, Any]:
    return job_body(template=fields)


def hub_job(**template_fields: Any) -> dict[str, Any]:
    """A job that declares two Secrets of its own: the model token and the Hub push token."""
    body = job_body(template=template_fields)
    body["spec"]["model"]["tokenSecretRef"] = {"name": "hf-read", "key": "token"}
    body["spec"]["output"] = {"hub": {"repoId": "org/adapter", "tokenSecretRef": {"name": "hf-write", "key": "w"}}}
    return body


def errors(body: dict[str, Any], policy: PodPolicy = DEFAULT) -> list[str]:
    return [str(e) for e in check_job(FineTuneJob.from_body(body), policy)]


CASES: list[tuple[str, dict[str, Any], PodPolicy, list[str]]] = [
    (
        "a template within the default policy passes",
        template(
            image="ghcr.io/finetune-operator/trainer:0.2.0",
            serviceAccountName="default",
            priorityClassName="training",
            labels={"team": "nlp"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            securityContext={"runAsUser": 1000, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
        ),
        DEFAULT,
        [],
    ),
    (
        "an image from another repository is refused",
        template(image="docker.io/evil/miner:1"),
        DEFAULT,
        [f"spec.template.image: 'docker.io/evil/miner:1' {POLICY} (allowed: ghcr.io/finetune-operator/trainer)"],
    ),
    (
        "a longer repository name is not the allowed repository",
        template(image="ghcr.io/finetune-operator/trainer-evil:1"),
        DEFAULT,
        [
            "spec.template.image: 'ghcr.io/finetune-operator/trainer-evil:1' "
            f"{POLICY} (allowed: ghcr.io/finetune-operator/trainer)"
        ],
    ),
    (
        "a digest of the allowed repository passes",
        template(image="ghcr.io/finetune-operator/trainer@sha256:" + "a" * 64),
        DEFAULT,
        [],
    ),
    (
        "a prefix ending in a slash allows every repository below it",
        template(image="registry.local:5000/ml/trainer-cuda:2"),
        PodPolicy(allowed_images=("registry.local:5000/ml/",)),
        [],
    ),
    (
        "an exact reference allows that reference only",
        template(image="ghcr.io/org/trainer:2"),
        PodPolicy(allowed_images=("ghcr.io/org/trainer:1",)),
        [f"spec.template.image: 'ghcr.io/org/trainer:2' {POLICY} (allowed: ghcr.io/org/trainer:1)"],
    ),
    ("a star allows any image", template(image="docker.io/evil/miner:1"), PodPolicy(allowed_images=("*",)), []),
    (
        "the namespace-admin ServiceAccount is refused",
        template(serviceAccountName="ns-admin"),
        DEFAULT,
        [f"spec.template.serviceAccountName: 'ns-admin' {POLICY} (allowed: default)"],
    ),
    (
        "an allowed ServiceAccount passes",
        template(serviceAccountName="trainer"),
        PodPolicy(allowed_service_accounts=("default", "trainer")),
        [],
    ),
    (
        "with an emptied list not even the default ServiceAccount may be named",
        template(serviceAccountName="default"),
        PodPolicy(allowed_service_accounts=()),
        [f"spec.template.serviceAccountName: 'default' {POLICY} (allowed: none)"],
    ),
    (
        "system-node-critical is refused although any class is allowed",
        template(priorityClassName="system-node-critical"),
        DEFAULT,
        [f"spec.template.priorityClassName: 'system-node-critical' {POLICY} (allowed: *; * excludes system-* classes)"],
    ),
    (
        "a system class the policy names passes",
        template(priorityClassName="system-cluster-critical"),
        PodPolicy(allowed_priority_classes=("*", "system-cluster-critical")),
        [],
    ),
    (
        "a class outside a list without a star is refused",
        template(priorityClassName="urgent"),
        PodPolicy(allowed_priority_classes=("batch-low", "batch-high")),
        [f"spec.template.priorityClassName: 'urgent' {POLICY} (allowed: batch-low, batch-high)"],
    ),
    (
        "AppArmor unconfined through an annotation is refused even where every annotation is allowed",
        template(annotations={"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}),
        ANY_ANNOTATION,
        [
            "spec.template.annotations[container.apparmor.security.beta.kubernetes.io/trainer]: sets an AppArmor or "
            "seccomp profile ('unconfined'), which is not allowed by the operator's pod policy (security level: "
            "restricted; use securityContext where it allows)"
        ],
    ),
    (
        "a seccomp annotation is refused at the restricted level whatever its value",
        template(annotations={"seccomp.security.alpha.kubernetes.io/pod": "runtime/default"}),
        ANY_ANNOTATION,
        [
            "spec.template.annotations[seccomp.security.alpha.kubernetes.io/pod]: sets an AppArmor or seccomp "
            "profile ('runtime/default'), which is not allowed by the operator's pod policy (security level: "
            "restricted; use securityContext where it allows)"
        ],
    ),
    (
        "the baseline level refuses only an unconfined profile",
        template(
            annotations={
                "container.apparmor.security.beta.kubernetes.io/trainer": "localhost/train",
                "container.seccomp.security.alpha.kubernetes.io/trainer": "Unconfined",
            }
        ),
        PodPolicy(allowed_annotation_prefixes=("*",), security_level="baseline"),
        [
            "spec.template.annotations[container.seccomp.security.alpha.kubernetes.io/trainer]: sets an AppArmor or "
            "seccomp profile ('Unconfined'), which is not allowed by the operator's pod policy (security level: "
            "baseline; use securityContext where it allows)"
        ],
    ),
    (
        "the privileged level leaves profile annotations to the annotation allow-list",
        template(annotations={"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}),
        PodPolicy(security_level="privileged"),
        [
            "spec.template.annotations[container.apparmor.security.beta.kubernetes.io/trainer]: "
            f"'container.apparmor.security.beta.kubernetes.io/trainer' {POLICY} (allowed: none)"
        ],
    ),
    (
        "an annotation is refused by default",
        template(annotations={"iam.amazonaws.com/role": "admin"}),
        DEFAULT,
        [f"spec.template.annotations[iam.amazonaws.com/role]: 'iam.amazonaws.com/role' {POLICY} (allowed: none)"],
    ),
    (
        "an annotation under an allowed prefix passes",
        template(annotations={"prometheus.io/scrape": "true"}),
        PodPolicy(allowed_annotation_prefixes=("prometheus.io/",)),
        [],
    ),
    (
        "a label outside the allowed label prefixes is refused",
        template(labels={"app": "postgres", "team.example.com/owner": "nlp"}),
        PodPolicy(allowed_label_prefixes=("team.example.com/",)),
        [f"spec.template.labels[app]: 'app' {POLICY} (allowed: team.example.com/)"],
    ),
    (
        "a toleration of a key outside the list is refused",
        template(tolerations=[{"key": "CriticalAddonsOnly", "operator": "Exists"}]),
        DEFAULT,
        [
            f"spec.template.tolerations[0].key: 'CriticalAddonsOnly' {POLICY} "
            "(allowed: nvidia.com/gpu, node.kubernetes.io/not-ready, node.kubernetes.io/unreachable)"
        ],
    ),
    (
        "a toleration prefix ending in a slash allows the keys below it",
        template(tolerations=[{"key": "example.com/gpu-pool", "operator": "Equal", "value": "a"}]),
        PodPolicy(allowed_tolerations=("example.com/",)),
        [],
    ),
    (
        "a star allows any toleration key",
        template(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml"}]),
        PodPolicy(allowed_tolerations=("*",)),
        [],
    ),
    (
        "a privileged container is refused",
        template(securityContext={"privileged": True}),
        DEFAULT,
        [f"spec.template.securityContext.privileged: true {POLICY} (security level restricted: false)"],
    ),
    (
        "running as root is refused at the restricted level",
        template(securityContext={"runAsUser": 0, "runAsNonRoot": False}),
        DEFAULT,
        [
            f"spec.template.securityContext.runAsNonRoot: false {POLICY} (security level restricted: true)",
            f"spec.template.securityContext.runAsUser: 0 {POLICY} (security level restricted: a uid other than 0)",
        ],
    ),
    (
        "an added capability and a drop list without ALL are refused",
        template(securityContext={"capabilities": {"add": ["SYS_ADMIN", "NET_BIND_SERVICE"], "drop": ["NET_RAW"]}}),
        DEFAULT,
        [
            f'spec.template.securityContext.capabilities.add: ["SYS_ADMIN"] {POLICY} '
            "(security level restricted: NET_BIND_SERVICE)",
            f'spec.template.securityContext.capabilities.drop: ["NET_RAW"] {POLICY} '
            "(security level restricted: a list with ALL)",
        ],
    ),
    (
        "unconfined seccomp and AppArmor, privilege escalation and a writable root are refused",
        template(
            securityContext={
                "seccompProfile": {"type": "Unconfined"},
                "appArmorProfile": {"type": "Unconfined"},
                "allowPrivilegeEscalation": True,
                "readOnlyRootFilesystem": False,
            }
        ),
        DEFAULT,
        [
            f'spec.template.securityContext.appArmorProfile.type: "Unconfined" {POLICY} '
            "(security level restricted: RuntimeDefault or Localhost)",
            f'spec.template.securityContext.seccompProfile.type: "Unconfined" {POLICY} '
            "(security level restricted: RuntimeDefault or Localhost)",
            f"spec.template.securityContext.allowPrivilegeEscalation: true {POLICY} (security level restricted: false)",
            f"spec.template.securityContext.readOnlyRootFilesystem: false {POLICY} (security level restricted: true)",
        ],
    ),
    (
        "a host process, an unmasked /proc and a foreign SELinux type are refused",
        template(
            securityContext={
                "windowsOptions": {"hostProcess": True},
                "procMount": "Unmasked",
                "seLinuxOptions": {"type": "spc_t", "user": "root"},
            }
        ),
        DEFAULT,
        [
            f"spec.template.securityContext.windowsOptions.hostProcess: true {POLICY} "
            "(security level restricted: false)",
            f'spec.template.securityContext.procMount: "Unmasked" {POLICY} (security level restricted: Default)',
            f'spec.template.securityContext.seLinuxOptions.type: "spc_t" {POLICY} (security level restricted: '
            "container_engine_t, container_init_t, container_kvm_t, container_t)",
            f'spec.template.securityContext.seLinuxOptions.user: "root" {POLICY} (security level restricted: unset)',
        ],
    ),
    (
        "the baseline level allows root and baseline capabilities but not a privileged container",
        template(
            securityContext={
                "runAsUser": 0,
                "runAsNonRoot": False,
                "readOnlyRootFilesystem": False,
                "capabilities": {"add": ["CHOWN", "SYS_ADMIN"]},
                "privileged": True,
            }
        ),
        PodPolicy(security_level="baseline"),
        [
            f"spec.template.securityContext.privileged: true {POLICY} (security level baseline: false)",
            f'spec.template.securityContext.capabilities.add: ["SYS_ADMIN"] {POLICY} (security level baseline: '
            "AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, "
            "SETPCAP, SETUID, SYS_CHROOT)",
        ],
    ),
    (
        "the privileged level allows a privileged container",
        template(securityContext={"privileged": True, "runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}}),
        PodPolicy(security_level="privileged"),
        [],
    ),
    (
        "every attack at once is reported at once",
        template(
            image="docker.io/evil/miner:1",
            serviceAccountName="ns-admin",
            priorityClassName="system-node-critical",
            annotations={"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"},
            tolerations=[{"operator": "Exists"}],
            labels={"finetune.dev/job-name": "other", "app": "postgres"},
            env=[{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
        ),
        DEFAULT,
        [
            f"spec.template.labels: {RESERVED_LABELS_MESSAGE}",
            f"spec.template.tolerations[0]: {TOLERATE_EVERYTHING_MESSAGE}",
            "spec.template.env[0].valueFrom.secretKeyRef: Secret 'db' key 'password' is not one of the job's own "
            "secret references (none); a pod reads only the Secret keys its spec names",
            f"spec.template.image: 'docker.io/evil/miner:1' {POLICY} (allowed: ghcr.io/finetune-operator/trainer)",
            f"spec.template.serviceAccountName: 'ns-admin' {POLICY} (allowed: default)",
            f"spec.template.priorityClassName: 'system-node-critical' {POLICY} (allowed: *; * excludes system-* "
            "classes)",
            "spec.template.annotations[container.apparmor.security.beta.kubernetes.io/trainer]: sets an AppArmor or "
            "seccomp profile ('unconfined'), which is not allowed by the operator's pod policy (security level: "
            "restricted; use securityContext where it allows)",
        ],
    ),
]


@pytest.mark.parametrize(("body", "policy", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pod_policy(body: dict[str, Any], policy: PodPolicy, expected: list[str]) -> None:
    assert errors(body, policy) == expected


RULES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "a label under finetune.dev/ is refused with the CRD's message",
        template(labels={"finetune.dev/attempt": "9"}),
        [f"spec.template.labels: {RESERVED_LABELS_MESSAGE}"],
    ),
    (
        "the managed-by label and the Job controller's labels are refused",
        template(labels={"app.kubernetes.io/managed-by": "me", "batch.kubernetes.io/job-name": "x"}),
        [f"spec.template.labels: {RESERVED_LABELS_MESSAGE}"],
    ),
    (
        "a toleration of every taint is refused with the CRD's message",
        template(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}, {"key": "", "operator": "Exists"}]),
        [f"spec.template.tolerations[1]: {TOLERATE_EVERYTHING_MESSAGE}"],
    ),
    (
        "an env secretKeyRef to a Secret the job does not name is refused, naming the job's own",
        hub_job(env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "ns-admin-token", "key": "token"}}}]),
        [
            "spec.template.env[0].valueFrom.secretKeyRef: Secret 'ns-admin-token' key 'token' is not one of the "
            "job's own secret references (spec.model.tokenSecretRef: hf-read/token, spec.output.hub.tokenSecretRef: "
            "hf-write/w); a pod reads only the Secret keys its spec names"
        ],
    ),
    (
        "another key of a Secret the job names is refused",
        hub_job(env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "hf-read", "key": "other"}}}]),
        [
            "spec.template.env[0].valueFrom.secretKeyRef: Secret 'hf-read' key 'other' is not one of the "
            "job's own secret references (spec.model.tokenSecretRef: hf-read/token, spec.output.hub.tokenSecretRef: "
            "hf-write/w); a pod reads only the Secret keys its spec names"
        ],
    ),
    (
        "env secretKeyRefs to the job's own Secret keys pass",
        hub_job(
            env=[
                {"name": "HUB_READ", "valueFrom": {"secretKeyRef": {"name": "hf-read", "key": "token"}}},
                {"name": "HUB_WRITE", "valueFrom": {"secretKeyRef": {"name": "hf-write", "key": "w"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ]
        ),
        [],
    ),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in RULES], ids=[c[0] for c in RULES])
def test_rules_without_configuration(body: dict[str, Any], expected: list[str]) -> None:
    """The same under any policy: even the most permissive one cannot allow these."""
    anything = PodPolicy(
        allowed_images=("*",),
        allowed_service_accounts=("*",),
        allowed_annotation_prefixes=("*",),
        allowed_tolerations=("*",),
        security_level="privileged",
    )
    assert errors(body) == expected
    assert errors(body, anything) == expected


def test_env_from_is_not_a_template_field() -> None:
    """No envFrom at all: a whole Secret cannot reach the pod through the template."""
    body = template(envFrom=[{"secretRef": {"name": "ns-admin-token"}}])
    with pytest.raises(InvalidSpecError) as info:
        FineTuneJob.from_body(body)
    assert [str(e) for e in info.value.errors] == [
        "spec.template.envFrom: unknown field (check the spelling; fields are camelCase)"
    ]


def test_a_violation_stops_rendering_and_the_policy_that_allows_it_renders() -> None:
    job = FineTuneJob.from_body(template(serviceAccountName="ns-admin"))
    with pytest.raises(InvalidSpecError) as info:
        render_all(job)
    assert [str(e) for e in info.value.errors] == [
        f"spec.template.serviceAccountName: 'ns-admin' {POLICY} (allowed: default)"
    ]
    allowing = RenderOptions(policy=PodPolicy(allowed_service_accounts=("ns-admin",)))
    assert render_all(job, allowing).job["spec"]["template"]["spec"]["serviceAccountName"] == "ns-admin"


def pod_spec(body: dict[str, Any], policy: PodPolicy = DEFAULT) -> dict[str, Any]:
    spec: dict[str, Any] = render_all(FineTuneJob.from_body(body), RenderOptions(policy=policy)).job["spec"]
    return dict(spec["template"]["spec"])


def test_the_trainer_pod_is_restricted_with_writable_tmp_and_cache() -> None:
    spec = pod_spec(job_body())
    (container,) = spec["containers"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert {mounts["tmp"], mounts["cache"]} == {"/tmp", "/home/ftjob/.cache"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}} and volumes["cache"] == {"name": "cache", "emptyDir": {}}


def test_a_template_security_context_is_merged_key_by_key() -> None:
    spec = pod_spec(template(securityContext={"runAsUser": 1000, "capabilities": {"drop": ["ALL", "NET_RAW"]}}))
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL", "NET_RAW"]},
        "runAsUser": 1000,
    }


def test_tolerations_render_without_empty_fields() -> None:
    spec = pod_spec(template(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]))
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("ghcr.io/finetune-operator/trainer:0.1.0", "ghcr.io/finetune-operator/trainer"),
        ("localhost:5000/trainer", "localhost:5000/trainer"),
        ("localhost:5000/trainer:dev@sha256:abc", "localhost:5000/trainer"),
        ("trainer", "trainer"),
    ],
    ids=["a tag", "a registry port is not a tag", "a tag and a digest", "a bare name"],
)
def test_image_repository(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def parse_operator(*flags: str) -> PodPolicy:
    args = build_parser().parse_args(["operator", *flags])
    return policy_from_flags(args, image="localhost/finetune-operator/trainer:dev")


def test_without_flags_the_operator_allows_its_own_trainer_repository_and_the_defaults() -> None:
    assert parse_operator() == PodPolicy(allowed_images=("localhost/finetune-operator/trainer",))


def test_flags_replace_their_default_repeat_and_an_empty_value_allows_nothing() -> None:
    assert parse_operator(
        "--allowed-image=*",
        "--allowed-service-account=default",
        "--allowed-service-account=trainer",
        "--allowed-service-account=trainer",
        "--allowed-priority-class=",
        "--allowed-annotation-prefix=prometheus.io/",
        "--allowed-label-prefix=team/",
        "--allowed-toleration=*",
        "--pod-security-level=baseline",
    ) == PodPolicy(
        allowed_images=("*",),
        allowed_service_accounts=("default", "trainer"),
        allowed_priority_classes=(),
        allowed_annotation_prefixes=("prometheus.io/",),
        allowed_label_prefixes=("team/",),
        allowed_tolerations=("*",),
        security_level="baseline",
    )


def test_ftjob_render_and_plan_assume_the_default_policy_and_take_its_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(template(serviceAccountName="ns-admin", image="trainer:test")))
    refused = f"spec.template.serviceAccountName: 'ns-admin' {POLICY} (allowed: default)"
    for argv in (
        ["render", str(job_file), "--out", str(tmp_path / "out"), "--image", "trainer:test"],
        ["plan", str(job_file)],
    ):
        capsys.readouterr()
        assert main(argv) == EXIT_INVALID
        assert refused in capsys.readouterr().err
        assert main([*argv, "--allowed-service-account=ns-admin", "--allowed-image=trainer"]) == 0
    assert "serviceAccountName: ns-admin" in (tmp_path / "out" / "manifests.yaml").read_text()
