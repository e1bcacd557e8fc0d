"""The only module that talks to the Kubernetes API server (besides kopf's own watches).

A thin async client over `kubernetes_asyncio`: server-side apply, create-if-absent, delete,
suspend, status patch, events, TokenReview and pod lookup. It tolerates the answers that mean
"already done" (409 on create, 404 on delete) so every call is idempotent, and turns conflicts,
throttling and server errors into `kopf.TemporaryError` so kopf retries them. It makes no
decisions; it never logs object bodies, tokens or env.
"""

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from finetune_api import constants

FIELD_MANAGER = "finetune-operator"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
log = logging.getLogger(__name__)


class RejectedError(Exception):
    """The API server refused a child as invalid (400/422): retrying the same spec cannot help."""


def _rejected(exc: ApiException, what: str) -> RejectedError:
    try:
        detail = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        detail = exc.reason
    return RejectedError(f"the API server rejected {what}: {detail}")


def _retry(exc: ApiException, what: str) -> kopf.TemporaryError:
    """A transient API failure, retried by kopf soon (1 s: the hot path must stay fast)."""
    return kopf.TemporaryError(f"{what}: HTTP {exc.status} {exc.reason}", delay=1)


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


async def _send(call: Any, *args: Any, **kwargs: Any) -> None:
    """Call an API method whose answer is not used, without turning the answer into client models
    (kubernetes_asyncio's deserialization was 8% of the operator's CPU in a burst); errors still raise
    `ApiException`, as with the default call."""
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

    async def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply a ConfigMap or Service with our field manager (create or update)."""
        meta = obj["metadata"]
        core = self.core
        call = core.patch_namespaced_config_map if obj["kind"] == "ConfigMap" else core.patch_namespaced_service
        try:
            await _send(
                call,
                meta["name"],
                meta["namespace"],
                obj,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
            )
        except ApiException as exc:
            if exc.status in (400, 422):
                raise _rejected(exc, f"{obj['kind']} {meta['name']}") from None
            raise _retry(exc, f"apply {obj['kind']} {meta['name']}") from None

    async def create_job(self, obj: dict[str, Any]) -> bool:
        """Create an attempt's Job unless it exists; True when this call created it."""
        meta = obj["metadata"]
        try:
            await _send(self.batch.create_namespaced_job, meta["namespace"], obj, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status in (400, 422):
                raise _rejected(exc, f"Job {meta['name']}") from None
            if exc.status in RETRYABLE:
                raise _retry(exc, f"create Job {meta['name']}") from None
            raise
        return True

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete an attempt's Job; its pods go with it in the background."""
        try:
            await _send(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise _retry(exc, f"delete Job {name}") from None

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

    async def delete_child(self, kind: str, namespace: str, name: str) -> None:
        """Delete a ConfigMap or Service (cleanup after a rejected spec); gone already is fine."""
        call = self.core.delete_namespaced_config_map if kind == "ConfigMap" else self.core.delete_namespaced_service
        try:
            await _send(call, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise _retry(exc, f"delete {kind} {name}") from None

    async def suspend_job(self, namespace: str, name: str, suspend: bool) -> None:
        """Set the attempt Job's spec.suspend (the Job controller deletes or recreates pods)."""
        try:
            await _send(
                self.batch.patch_namespaced_job,
                name,
                namespace,
                {"spec": {"suspend": suspend}},
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

    async def pod_identity(self, namespace: str, name: str) -> tuple[str, dict[str, str]] | None:
        """A pod's uid and labels, or None when it does not exist."""
        try:
            pod = await self.core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return str(pod.metadata.uid), dict(pod.metadata.labels or {})
