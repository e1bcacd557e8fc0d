"""The only module that talks to the Kubernetes API server (besides kopf's own watches).

A thin async client over `kubernetes_asyncio`: create, server-side apply, delete, suspend, status
patch, events, TokenReview and pod lookup. Children are created with a plain create; a 409 answers
with the existing object's metadata (`Existing`) so the caller can check whose it is before anything
else happens, and every later write or delete of a child names it by uid (a precondition), so it can
never land on another object of that name. Server-side apply never forces a field another manager
holds (`FieldConflictError`). Throttling and server errors become `runtime.RetryLaterError`, so the work
queue runs the round again a second later. It makes no decisions; it never logs object bodies, tokens or env.
"""

import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from finetune_api import constants
from finetune_operator.runtime import RetryLaterError

FIELD_MANAGER = "finetune-operator"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})
# A server-side apply conflict names each other manager so: `conflict with "kubectl-edit" using v1: .data.x`.
_CONFLICT_MANAGER = re.compile(r'conflict with "([^"]*)"')
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
log = logging.getLogger(__name__)


class RejectedError(Exception):
    """The API server refused a child (400/422 invalid; 403 forbidden, e.g. by the chart's admission policy):
    retrying the same spec cannot help."""


REJECTED = frozenset({400, 403, 422})


class FieldConflictError(Exception):
    """Server-side apply found fields of a child that another field manager holds with other values."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"{kind} {name}: {detail}")
        self.kind, self.name, self.detail = kind, name, detail


@dataclass(frozen=True)
class Created:
    """A child this call created: enough to take it back (a delete with its uid as the precondition).

    The create's answer is kept as bytes and decoded only if the uid is asked for (a rollback): on the
    common path nobody reads it (see `_send`).
    """

    kind: str
    namespace: str
    name: str
    answer: bytes

    @property
    def uid(self) -> str:
        return str(self.body["metadata"]["uid"])

    @property
    def body(self) -> dict[str, Any]:
        """The object as created (the answer decoded): what its first watch event will show."""
        body: dict[str, Any] = json.loads(self.answer)
        return body


@dataclass(frozen=True)
class Existing:
    """A create found the name taken (409): the metadata of the object that holds it, for `claim`."""

    kind: str
    name: str
    meta: dict[str, Any]


def _rejected(exc: ApiException, what: str) -> RejectedError:
    try:
        detail = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        detail = exc.reason
    return RejectedError(f"the API server rejected {what}: {detail}")


def _retry(exc: ApiException, what: str) -> RetryLaterError:
    """A transient API failure, retried by the work queue soon (1 s: the hot path must stay fast)."""
    return RetryLaterError(f"{what}: HTTP {exc.status} {exc.reason}", delay=1)


def _skip_env_lookups(api: client.ApiClient) -> None:
    """Reopen the client's aiohttp session with trust_env off (same connector and read buffer).

    kubernetes_asyncio opens it with trust_env=True, so aiohttp reads ~/.netrc and the proxy variables in
    a worker thread on every request: 13% of the operator's samples in a 100-job burst. Only called when
    no proxy variable is set; a kubeconfig `proxy-url` is passed per request and still works.
    """
    rest: Any = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    connector = old.connector
    old.detach()  # the old session lets go of the connector without closing it
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)


async def _answer(call: Any, *args: Any, **kwargs: Any) -> bytes:
    """Call an API method and return its answer undecoded: kubernetes_asyncio's deserialization into client
    models was 8% of the operator's CPU in a burst. Errors still raise `ApiException`, as with the default
    call, with a readable body."""
    response = await call(*args, _preload_content=False, **kwargs)
    try:
        data = await response.read()  # read to the end, so the connection goes back to the pool
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        exc = ApiException(status=response.status, reason=response.reason)
        exc.body = data.decode("utf-8", "replace")
        exc.headers = response.headers
        raise exc
    answer: bytes = data
    return answer


async def _send(call: Any, *args: Any, **kwargs: Any) -> None:
    """Call an API method whose answer is not used (read and released, never decoded)."""
    await _answer(call, *args, **kwargs)


def _causes(exc: ApiException) -> list[dict[str, Any]]:
    """The `details.causes` of an API error's Status (empty when it has none or is not JSON)."""
    try:
        causes = (json.loads(exc.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        return []
    return [c for c in causes if isinstance(c, dict)]


def _conflicting_managers(exc: ApiException) -> set[str]:
    """The other field managers a server-side apply conflict names (empty when it names none)."""
    return {m for cause in _causes(exc) for m in _CONFLICT_MANAGER.findall(str(cause.get("message", "")))}


def _uid_refused(exc: ApiException) -> bool:
    """The API server refused a write because the object under the name has another uid than the one named."""
    return any(cause.get("field") == "metadata.uid" for cause in _causes(exc))


def _conflict_detail(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


@dataclass
class Kube:
    """API handles shared by every handler (kept in memo, never in a module global)."""

    api: client.ApiClient

    @classmethod
    async def connect(cls) -> "Kube":
        """In-cluster credentials when running in a pod, else the kubeconfig (tests, laptops)."""
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            await config.load_kube_config()
        api = client.ApiClient()
        if not any(os.environ.get(v) for v in PROXY_ENV):
            _skip_env_lookups(api)
        return cls(api=api)

    async def close(self) -> None:
        await self.api.close()

    # Typed as Any: the generated clients take plain dicts and `_content_type`, which their stubs deny.
    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> Any:
        return client.BatchV1Api(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def _calls(self, kind: str) -> tuple[Any, Any, Any, Any]:
        """(create, read, patch, delete) of a child kind: Job, ConfigMap or Service."""
        if kind == "Job":
            b = self.batch
            return b.create_namespaced_job, b.read_namespaced_job, b.patch_namespaced_job, b.delete_namespaced_job
        c = self.core
        if kind == "ConfigMap":
            return (
                c.create_namespaced_config_map,
                c.read_namespaced_config_map,
                c.patch_namespaced_config_map,
                c.delete_namespaced_config_map,
            )
        if kind == "Service":
            return (
                c.create_namespaced_service,
                c.read_namespaced_service,
                c.patch_namespaced_service,
                c.delete_namespaced_service,
            )
        raise ValueError(f"not a child kind: {kind}")

    async def get_finetunejob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job as it is now (not a cached copy), or None when it is gone."""
        try:
            body: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _retry(exc, f"get {namespace}/{name}") from None
        return body

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the status subresource (only the keys given): the job as written, None when it is gone."""
        try:
            written: dict[str, Any] = await self.custom.patch_namespaced_custom_object_status(
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _retry(exc, f"patch status of {namespace}/{name}") from None
        return written

    async def delete_finetunejob(self, namespace: str, name: str, uid: str | None) -> None:
        """Delete the job itself (TTL); the precondition on uid spares a re-created namesake."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.custom.delete_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name, body=body
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise _retry(exc, f"delete {namespace}/{name}") from None

    async def create(self, obj: dict[str, Any]) -> Created | Existing:
        """Create a child (Job, ConfigMap or Service) with a plain create, never touching an existing one.

        `Created` when this call made it; `Existing` with the metadata of the object that already holds
        the name (whoever's it is: the caller decides with `claim`).
        """
        kind, meta = obj["kind"], obj["metadata"]
        create, read, _, _ = self._calls(kind)
        try:
            answer = await _answer(create, meta["namespace"], obj, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status == 409:
                existing = await self._metadata(read, kind, meta["namespace"], meta["name"])
                if existing is None:  # deleted in between: try again
                    raise _retry(exc, f"create {kind} {meta['name']}") from None
                return Existing(kind, meta["name"], existing)
            if exc.status in REJECTED:
                raise _rejected(exc, f"{kind} {meta['name']}") from None
            if exc.status in RETRYABLE:
                raise _retry(exc, f"create {kind} {meta['name']}") from None
            raise
        return Created(kind, meta["namespace"], meta["name"], answer)

    async def _metadata(self, read: Any, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object's metadata (decoded from the raw answer, no client models), None when it is gone."""
        try:
            answer = await _answer(read, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _retry(exc, f"get {kind} {name}") from None
        meta: dict[str, Any] = json.loads(answer)["metadata"]
        return meta

    async def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply a ConfigMap or Service that is already this job's; `metadata.uid` is required.

        The uid is a precondition (a different object under the name makes the API server refuse the
        change), and nothing is forced: a field another manager holds is a `FieldConflictError`. The one
        exception is our own create's entry: a plain create records our fields under the `Update`
        operation, which server-side apply counts as another manager of the same name, so a conflict
        naming only `finetune-operator` is ours and is resolved by applying again with force.
        """
        kind, meta = obj["kind"], obj["metadata"]
        if not meta.get("uid"):
            raise ValueError(f"apply {kind} {meta['name']}: only an existing child (with its uid) is applied")
        _, _, patch, _ = self._calls(kind)
        force = False
        while True:
            try:
                await _send(
                    patch,
                    meta["name"],
                    meta["namespace"],
                    obj,
                    field_manager=FIELD_MANAGER,
                    force=force,
                    _content_type=APPLY_PATCH,
                )
                return
            except ApiException as exc:
                if exc.status == 409 and not force:
                    managers = _conflicting_managers(exc)
                    if managers == {FIELD_MANAGER}:
                        force = True  # only our own create's fields: ours to move to the apply entry
                        continue
                    if managers:
                        raise FieldConflictError(kind, meta["name"], _conflict_detail(exc)) from None
                # Another object holds the name now ("metadata.uid: field is immutable"; 409 "uid mismatch" when
                # none does): not ours to change. The next round sees it and creates, or finds whose it is.
                if exc.status in REJECTED and not _uid_refused(exc):
                    raise _rejected(exc, f"{kind} {meta['name']}") from None
                raise _retry(exc, f"apply {kind} {meta['name']}") from None

    async def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete one child, only if it is still the object with this uid (a precondition): gone already, or
        replaced by another object of that name, is left alone. A Job's pods go with it in the background."""
        _, _, _, delete = self._calls(kind)
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await _send(delete, name, namespace, body=body)
        except ApiException as exc:
            if exc.status == 409:
                log.warning("not deleting %s %s/%s: it is no longer the object with uid %s", kind, namespace, name, uid)
            elif exc.status != 404:
                raise _retry(exc, f"delete {kind} {name}") from None

    async def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """kopf's (Cluster)KopfPeering object, or None when it does not exist."""
        try:
            if namespace is None:
                body = await self.custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
            else:
                body = await self.custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _retry(exc, f"get peering {name}") from None
        return dict(body)

    async def suspend_job(self, namespace: str, name: str, uid: str, suspend: bool) -> None:
        """Set the attempt Job's spec.suspend (the Job controller deletes or recreates pods).

        The patch carries the Job's uid: on another object of that name the API server refuses the change
        (the uid is immutable), and the next round no longer sees a Job of ours to suspend.
        """
        try:
            await _send(
                self.batch.patch_namespaced_job,
                name,
                namespace,
                {"metadata": {"uid": uid}, "spec": {"suspend": suspend}},
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _retry(exc, f"suspend Job {name}") from None

    async def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the FineTuneJob; failures are logged, never raised (events are best effort)."""
        meta = job["metadata"]
        now = datetime.now(UTC).isoformat()
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": constants.API_VERSION,
                "kind": constants.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await _send(self.core.create_namespaced_event, meta["namespace"], event)
        except ApiException as exc:
            log.warning(
                "could not post event %s on %s/%s: HTTP %s", reason, meta["namespace"], meta["name"], exc.status
            )

    async def review_token(self, token: str, audience: str) -> dict[str, Any]:
        """TokenReview for one audience; returns the review status as a plain dict."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        auth: Any = client.AuthenticationV1Api(self.api)
        review = await auth.create_token_review(body)
        result: dict[str, Any] = self.api.sanitize_for_serialization(review.status) or {}
        return result

    async def controlled_by(
        self, kind: str, namespace: str, name: str
    ) -> tuple[str, tuple[str, str, str] | None] | None:
        """A Pod's or Job's uid and its controlling ownerReference as (kind, name, uid); None when it does not exist."""
        read = self.core.read_namespaced_pod if kind == "Pod" else self.batch.read_namespaced_job
        try:
            obj = await read(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        meta = obj.metadata
        for ref in meta.owner_references or []:
            if ref.controller:
                return str(meta.uid), (str(ref.kind), str(ref.name), str(ref.uid))
        return str(meta.uid), None
