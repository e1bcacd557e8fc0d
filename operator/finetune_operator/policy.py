"""The operator's pod policy: what a FineTuneJob's `spec.template` may ask of the trainer pods.

The operator creates the trainer pods with its own rights. Whoever may create a FineTuneJob in a
namespace therefore runs pods there without holding the right to create pods, and the template is how
they shape those pods. Without a policy a template could name the namespace's most powerful
ServiceAccount, run any image, preempt system pods with a `system-*` priority class, tolerate every
taint, switch AppArmor or seccomp off through an annotation, or loosen the container's
securityContext. `PodPolicy` is what the operator's deployment allows (`ftjob operator` flags, the
chart's `podPolicy` values); `check_pod_policy` lists every way a job's template goes beyond it, with
field paths, and admission (`finetune_operator.admit`) refuses such a job (reason `InvalidSpec`) before any
child exists.

Rules that need no configuration are not here. Reserved label keys and a toleration of every taint are
entries of the API objects' rule tables (`finetune_api.v1alpha1.rules`): the CRD states them in CEL at
`kubectl apply` and `finetune_operator.validation.check_job` runs the same entries in Python. An env
`secretKeyRef` to a Secret the job does not name in its own secret references is one of `validation`'s
free-form rules (CEL cannot read env entries).

One grammar for every allow-list: `*` allows any value except the sensitive ones, which pass only when
named (a `system-*` priority class, the AppArmor/seccomp annotations, which the security level governs
instead); an empty entry (`--allowed-service-account=`) stands for nothing, so an allow-list can be
emptied. Images and tolerations also take prefixes ending in `/`; annotation and label entries are
prefixes of the key.

Pure: no I/O. The flag table is here too, so that `ftjob operator`, `ftjob render` and `ftjob plan`
build one policy from the same flags with the same defaults.
"""

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from finetune_api import constants
from finetune_api.v1alpha1.errors import FieldError
from finetune_api.v1alpha1.resource import FineTuneJob

ANY = "*"
SecurityLevel = Literal["restricted", "baseline", "privileged"]
SECURITY_LEVELS: tuple[str, ...] = get_args(SecurityLevel)
SYSTEM_PRIORITY_PREFIX = "system-"
# Annotations that set a pod's or container's AppArmor or seccomp profile (the kubelet still honours the
# AppArmor ones): the security level decides on them, whatever the annotation allow-list says.
SECURITY_ANNOTATION_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
UNCONFINED_ANNOTATION_VALUE = "unconfined"
# Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
BASELINE_SELINUX_TYPES = frozenset({"container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_SECCOMP_TYPES = ("RuntimeDefault", "Localhost")
TEMPLATE = "spec.template"


def image_repository(image: str) -> str:
    """`registry:5000/org/name:tag@sha256:...` -> `registry:5000/org/name` (a port is not a tag)."""
    name = image.split("@", 1)[0]
    colon = name.rfind(":")
    return name[:colon] if colon > name.rfind("/") else name


@dataclass(frozen=True)
class PodPolicy:
    """What a template may ask for; hashable, because it is part of the admission cache's key."""

    allowed_images: tuple[str, ...] = (image_repository(constants.DEFAULT_TRAINER_IMAGE),)
    """`spec.template.image`: repositories (any tag or digest of them), prefixes ending in `/`, or `*`.
    Default: the repository of the operator's default trainer image. A job without an image gets that one."""
    allowed_service_accounts: tuple[str, ...] = ("default",)
    """`spec.template.serviceAccountName`: names, or `*`. Default: the namespace's `default` only (a job that
    names none runs as `default` too), so a template cannot borrow a more powerful ServiceAccount."""
    allowed_priority_classes: tuple[str, ...] = (ANY,)
    """`spec.template.priorityClassName`: names, or `*` for any class not named `system-*`. Default: `*`, so
    `system-node-critical` and `system-cluster-critical` (which preempt cluster components) only when named."""
    allowed_annotation_prefixes: tuple[str, ...] = ()
    """`spec.template.annotations`: key prefixes, or `*`. Default: none. Annotations steer other controllers
    (service meshes, cloud IAM, network attachments), so each one is a decision of the cluster's admin."""
    allowed_label_prefixes: tuple[str, ...] = (ANY,)
    """`spec.template.labels`: key prefixes, or `*`. Default: `*` (the operator's and the Job controller's
    own keys are refused by the CRD). Labels that match another workload's Service selector draw its
    traffic; narrow this to prefixes of your own where namespaces share users."""
    allowed_tolerations: tuple[str, ...] = (
        constants.GPU_RESOURCE,
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    )
    """`spec.template.tolerations[].key`: keys, prefixes ending in `/`, or `*`. Default: the GPU taint and the
    node-lifecycle ones every pod already tolerates for a while. Never the empty key (the CRD refuses it)."""
    security_level: SecurityLevel = "restricted"
    """How far `spec.template.securityContext` and the AppArmor/seccomp annotations may loosen the trainer's
    securityContext: `restricted` (Pod Security `restricted`, and a read-only root filesystem), `baseline`
    (Pod Security `baseline`) or `privileged` (anything). Default: restricted."""


def _entries(allowed: Sequence[str]) -> str:
    return ", ".join(allowed) if allowed else "none"


def _refused(path: str, value: str, allowed: Sequence[str], note: str = "") -> FieldError:
    return FieldError(
        path, f"{value!r} is not allowed by the operator's pod policy (allowed: {_entries(allowed)}{note})"
    )


def _image_allowed(image: str, allowed: Sequence[str]) -> bool:
    """An entry is `*`, a prefix ending in `/` (every repository below it), or a repository, whose tags and
    digests are allowed, but not a longer repository name (`org/trainer` does not allow `org/trainer-x`)."""
    for entry in allowed:
        if entry == ANY or image == entry:
            return True
        if entry.endswith("/") and image.startswith(entry):
            return True
        if image_repository(image) == image_repository(entry) and (":" not in entry.rsplit("/", 1)[-1]):
            return True
    return False


def _name_allowed(name: str, allowed: Sequence[str]) -> bool:
    return ANY in allowed or name in allowed


def _priority_allowed(name: str, allowed: Sequence[str]) -> bool:
    return name in allowed or (ANY in allowed and not name.startswith(SYSTEM_PRIORITY_PREFIX))


def _prefix_allowed(key: str, allowed: Sequence[str]) -> bool:
    return any(entry == ANY or key.startswith(entry) for entry in allowed)


def _toleration_allowed(key: str, allowed: Sequence[str]) -> bool:
    return any(entry in (ANY, key) or (entry.endswith("/") and key.startswith(entry)) for entry in allowed)


def _security_annotation(key: str, value: str, level: SecurityLevel) -> bool:
    """True when the level refuses this AppArmor/seccomp annotation."""
    if not key.startswith(SECURITY_ANNOTATION_PREFIXES):
        return False
    if level == "restricted":
        return True
    return level == "baseline" and value.strip().lower() == UNCONFINED_ANNOTATION_VALUE


def _get(ctx: Mapping[str, Any], *path: str) -> Any:
    node: Any = ctx
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _security_context_problems(ctx: Mapping[str, Any], level: SecurityLevel) -> list[tuple[str, Any, str]]:
    """(field, value, what the level allows) for each value of the template's securityContext that is
    looser than `level`. The operator's own values are restricted, and a template key replaces the
    operator's key of the same name, so checking the template's keys alone checks the merged result."""
    if level == "privileged":
        return []
    strict = level == "restricted"
    problems: list[tuple[str, Any, str]] = []

    def refuse(field: str, value: Any, allowed: str) -> None:
        problems.append((field, value, allowed))

    if ctx.get("privileged") is True:
        refuse("privileged", True, "false")
    if _get(ctx, "windowsOptions", "hostProcess") is True:
        refuse("windowsOptions.hostProcess", True, "false")
    if ctx.get("procMount") not in (None, "Default"):
        refuse("procMount", ctx["procMount"], "Default")
    profiles = " or ".join(RESTRICTED_SECCOMP_TYPES)
    if _get(ctx, "appArmorProfile", "type") == "Unconfined":
        refuse("appArmorProfile.type", "Unconfined", profiles)
    if isinstance(ctx.get("seccompProfile"), Mapping):  # null: the pod's RuntimeDefault applies
        seccomp = _get(ctx, "seccompProfile", "type")
        if seccomp == "Unconfined" or (strict and seccomp not in RESTRICTED_SECCOMP_TYPES):
            refuse("seccompProfile.type", seccomp, profiles)
    selinux = ctx.get("seLinuxOptions")
    if isinstance(selinux, Mapping):
        if selinux.get("type") not in (None, "", *sorted(BASELINE_SELINUX_TYPES)):
            refuse("seLinuxOptions.type", selinux["type"], ", ".join(sorted(BASELINE_SELINUX_TYPES)))
        for field in ("user", "role"):
            if selinux.get(field):
                refuse(f"seLinuxOptions.{field}", selinux[field], "unset")
    if "capabilities" in ctx:
        add = _get(ctx, "capabilities", "add") or []
        allowed_caps = RESTRICTED_CAPABILITIES if strict else BASELINE_CAPABILITIES
        extra = sorted(str(c) for c in add if c not in allowed_caps) if isinstance(add, list) else [str(add)]
        if extra:
            refuse("capabilities.add", extra, ", ".join(sorted(allowed_caps)))
        drop = _get(ctx, "capabilities", "drop") or []
        if strict and (not isinstance(drop, list) or "ALL" not in drop):
            refuse("capabilities.drop", drop, "a list with ALL")
    if strict:
        for field, want in (("allowPrivilegeEscalation", False), ("readOnlyRootFilesystem", True)):
            if field in ctx and ctx[field] is not want:
                refuse(field, ctx[field], json.dumps(want))
        if "runAsNonRoot" in ctx and ctx["runAsNonRoot"] is False:
            refuse("runAsNonRoot", False, "true")
        if ctx.get("runAsUser") == 0:
            refuse("runAsUser", 0, "a uid other than 0")
    return problems


def check_pod_policy(job: FineTuneJob, policy: PodPolicy) -> list[FieldError]:
    """Every way `spec.template` goes beyond the policy; empty when the pods it asks for are allowed."""
    template = job.spec.template
    errors: list[FieldError] = []
    if template.image is not None and not _image_allowed(template.image, policy.allowed_images):
        errors.append(_refused(f"{TEMPLATE}.image", template.image, policy.allowed_images))
    account = template.service_account_name
    if account and not _name_allowed(account, policy.allowed_service_accounts):
        errors.append(_refused(f"{TEMPLATE}.serviceAccountName", account, policy.allowed_service_accounts))
    priority = template.priority_class_name
    if priority and not _priority_allowed(priority, policy.allowed_priority_classes):
        note = f"; {ANY} excludes {SYSTEM_PRIORITY_PREFIX}* classes" if ANY in policy.allowed_priority_classes else ""
        errors.append(_refused(f"{TEMPLATE}.priorityClassName", priority, policy.allowed_priority_classes, note))
    for key, value in sorted(template.annotations.items()):
        path = f"{TEMPLATE}.annotations[{key}]"
        if _security_annotation(key, value, policy.security_level):
            errors.append(
                FieldError(
                    path,
                    f"sets an AppArmor or seccomp profile ({value!r}), which is not allowed by the operator's pod "
                    f"policy (security level: {policy.security_level}; use securityContext where it allows)",
                )
            )
        elif not _prefix_allowed(key, policy.allowed_annotation_prefixes):
            errors.append(_refused(path, key, policy.allowed_annotation_prefixes))
    for key in sorted(template.labels):
        if not _prefix_allowed(key, policy.allowed_label_prefixes):
            errors.append(_refused(f"{TEMPLATE}.labels[{key}]", key, policy.allowed_label_prefixes))
    for i, toleration in enumerate(template.tolerations):
        if toleration.key and not _toleration_allowed(toleration.key, policy.allowed_tolerations):
            errors.append(_refused(f"{TEMPLATE}.tolerations[{i}].key", toleration.key, policy.allowed_tolerations))
    for field, value, allowed in _security_context_problems(template.security_context or {}, policy.security_level):
        errors.append(
            FieldError(
                f"{TEMPLATE}.securityContext.{field}",
                f"{json.dumps(value)} is not allowed by the operator's pod policy "
                f"(security level {policy.security_level}: {allowed})",
            )
        )
    return errors


@dataclass(frozen=True)
class _ListFlag:
    """One repeatable `--allowed-*` flag and the PodPolicy field it fills."""

    flag: str
    field: str
    metavar: str
    help: str


LIST_FLAGS = (
    _ListFlag(
        "--allowed-image",
        "allowed_images",
        "IMAGE",
        "image a template may name: a repository (any tag or digest), a prefix ending in /, or *; "
        "default: the repository of --image",
    ),
    _ListFlag(
        "--allowed-service-account",
        "allowed_service_accounts",
        "NAME",
        "ServiceAccount a template may name, or *; default: default",
    ),
    _ListFlag(
        "--allowed-priority-class",
        "allowed_priority_classes",
        "NAME",
        "PriorityClass a template may name, or * (any but system-*, which must be named); default: *",
    ),
    _ListFlag(
        "--allowed-annotation-prefix",
        "allowed_annotation_prefixes",
        "PREFIX",
        "annotation key prefix a template may use, or *; default: none",
    ),
    _ListFlag(
        "--allowed-label-prefix",
        "allowed_label_prefixes",
        "PREFIX",
        "label key prefix a template may use, or *; default: * (reserved keys are always refused)",
    ),
    _ListFlag(
        "--allowed-toleration",
        "allowed_tolerations",
        "KEY",
        "taint key a template may tolerate: a key, a prefix ending in /, or *; default: "
        + ", ".join(PodPolicy().allowed_tolerations),
    ),
)


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """The pod policy's flags: each `--allowed-*` is repeatable and replaces its default; an empty value
    (`--allowed-label-prefix=`) allows nothing."""
    group = parser.add_argument_group("pod policy", "what spec.template of a FineTuneJob may ask for")
    for flag in LIST_FLAGS:
        group.add_argument(
            flag.flag, dest=flag.field, action="append", default=None, metavar=flag.metavar, help=flag.help
        )
    group.add_argument(
        "--pod-security-level",
        choices=SECURITY_LEVELS,
        default=PodPolicy.security_level,
        help="how far spec.template.securityContext may loosen the trainer's (restricted: Pod Security "
        "restricted plus a read-only root filesystem; baseline; privileged); default: restricted",
    )


def policy_from_flags(args: argparse.Namespace, *, image: str) -> PodPolicy:
    """The policy the flags describe; `image` is the default trainer image (`--image`)."""
    given = {
        flag.field: tuple(dict.fromkeys(v for v in values if v))
        for flag in LIST_FLAGS
        if (values := getattr(args, flag.field, None)) is not None
    }
    level = getattr(args, "pod_security_level", PodPolicy.security_level)
    return replace(PodPolicy(allowed_images=(image_repository(image),)), **given, security_level=level)
