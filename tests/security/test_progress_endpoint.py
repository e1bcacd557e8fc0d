"""The progress endpoint attacked on the real control plane (an `ftjob operator` with its own ServiceAccount
tokens checked by the real API server's TokenReview; trainer pods run by KWOK).

What a flood costs is read from the operator's own counter of TokenReviews
(`finetune_progress_token_reviews_total`) before and after; the API server's count of TokenReview requests
is printed beside it (other sessions may share the cluster, so it is not asserted). Floods are bounded in
count and in how long the test waits; no assertion is about speed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from finetune_operator.progress.auth import SOURCE_BURST, SOURCE_RATE
from finetune_operator.progress.reasons import Reason
from finetune_operator.progress.serving import (
    HANDSHAKE_TIMEOUT_SECONDS,
    HEADER_TIMEOUT_SECONDS,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_SOURCE,
)
from tests.controlplane.conftest import Cluster, cluster, namespace, wait_until
from tests.controlplane.operator.conftest import Operator, apply, crd, ftj, items, operator, status, wait_phase

# The control-plane fixtures this module uses, imported so that it needs no conftest of its own.
__all__ = ["cluster", "crd", "namespace", "operator"]
pytestmark = pytest.mark.controlplane

HUB = {"repoId": "acme/demo-adapter", "tokenSecretRef": {"name": "hf-token", "key": "token"}}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
GOOD_REPORT = {"progress": {"step": 7, "totalSteps": 10, "loss": 1.25, "percent": 70.0}}


def insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the operator's self-signed cert
    return context


@dataclass
class Target:
    """A running job ("demo", on hold, with a Hub output), its trainer pod and that pod's projected token."""

    cluster: Cluster
    operator: Operator
    namespace: str
    pod: str
    token: str
    name: str = "demo"

    @property
    def audience(self) -> str:
        return f"finetune.dev/progress/{self.namespace}/{self.name}"

    @property
    def url(self) -> str:
        return (
            f"https://127.0.0.1:{self.operator.progress_port}/v1/namespaces/{self.namespace}"
            f"/finetunejobs/{self.name}/progress"
        )

    def post(self, token: str | None, body: Any = GOOD_REPORT, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
        """One POST; the status and the JSON answer (which must never be a traceback or carry the token)."""
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, context=insecure(), timeout=30) as resp:
                code, text = int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            code, text = int(exc.code), exc.read().decode()
        assert "Traceback" not in text and (not token or token not in text), text
        return code, json.loads(text)

    def post_spaced(self, token: str | None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        """A POST a little over a second after the last: the job's own rate limit is not what is tested."""
        time.sleep(1.1)
        return self.post(token, **kwargs)

    def metrics(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(self.operator.metrics()):
            for sample in family.samples:
                found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return found

    def reviews(self) -> float:
        return sum(self.metrics().get("finetune_progress_token_reviews_total", {}).values())

    def rejected(self, reason: str) -> float:
        return self.metrics().get("finetune_progress_rejected_total", {}).get((("reason", reason),), 0.0)


def token_for(cluster: Cluster, namespace: str, audience: str, pod: str | None = None, account: str = "default") -> str:
    """What `kubectl create token` gives: with `pod`, bound to it like the trainer's projected token."""
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod] if pod else []
    return cluster.kubectl("-n", namespace, "create", "token", account, "--audience", audience, *bound).stdout.strip()


def apiserver_token_reviews(cluster: Cluster) -> float:
    """TokenReview requests the API server has served (all clients; informational)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{") and 'resource="tokenreviews"' in line
    )


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def forge(token: str, **claims: Any) -> str:
    """The same token with some claims changed (its signature no longer matches)."""
    head, payload, sig = token.split(".")
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    data.update(claims)
    return f"{head}.{base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip('=')}.{sig}"


def job_with_hub(name: str = "demo") -> dict[str, Any]:
    body = ftj("tiny-cpu", name=name, hold=True)
    body["spec"]["output"]["hub"] = dict(HUB)
    return body


@pytest.fixture
def target(cluster: Cluster, namespace: str, operator: Operator) -> Target:
    apply(cluster, namespace, job_with_hub())
    wait_phase(cluster, namespace, "Running", timeout=60)
    pod = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")[0]["metadata"]["name"]
    token = token_for(cluster, namespace, f"finetune.dev/progress/{namespace}/demo", pod)
    return Target(cluster, operator, namespace, pod, token)


async def _flood(url: str, tokens: list[str], body: bytes, concurrency: int) -> list[int]:
    """POST once per token, `concurrency` at a time; the statuses (0 for a connection the server dropped)."""
    import aiohttp

    codes: list[int] = []
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=insecure(), limit=concurrency, force_close=True))
    semaphore = asyncio.Semaphore(concurrency)

    async def one(token: str) -> None:
        async with semaphore:
            try:
                async with session.post(
                    url, data=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                ) as resp:
                    await resp.read()
                    codes.append(resp.status)
            except aiohttp.ClientError:
                codes.append(0)

    try:
        await asyncio.wait_for(asyncio.gather(*(one(t) for t in tokens)), 300)
    finally:
        await session.close()
    return codes


def flood(
    target: Target, tokens: list[str], concurrency: int = MAX_CONNECTIONS_PER_SOURCE // 2, body: Any = GOOD_REPORT
) -> list[int]:
    """Concurrent POSTs from one address, below its connection cap (so every answer is the endpoint's)."""
    return asyncio.run(_flood(target.url, tokens, json.dumps(body).encode(), concurrency))


# --- what the token alone rules out costs no TokenReview


def test_a_garbage_token_flood_costs_no_token_review(target: Target) -> None:
    reviews, api_reviews = target.reviews(), apiserver_token_reviews(target.cluster)
    codes = flood(target, [f"garbage-{i}" for i in range(2000)])
    assert codes.count(401) == 2000
    assert target.reviews() == reviews, "a garbage bearer cost a TokenReview"
    assert target.rejected("malformed_token") >= 2000
    print(
        f"\n2000 garbage bearers: {target.reviews() - reviews:.0f} TokenReviews by the operator, "
        f"{apiserver_token_reviews(target.cluster) - api_reviews:.0f} at the API server (all clients)"
    )


def test_forged_jwts_for_the_job_cost_at_most_the_per_source_budget(target: Target) -> None:
    """Tokens that claim everything right (this job's audience, namespace, a pod) but are not signed by the
    cluster pass the cheap checks; the per-address bucket bounds how many reach a TokenReview."""
    forged = [forge(target.token, jti=f"forged-{i}") for i in range(500)]
    reviews, started = target.reviews(), time.monotonic()
    codes = flood(target, forged)
    elapsed = time.monotonic() - started
    spent = target.reviews() - reviews
    assert set(codes) <= {401, 429} and codes.count(429) > 0
    assert spent <= SOURCE_BURST + SOURCE_RATE * elapsed + 1
    print(f"\n500 forged JWTs in {elapsed:.1f} s: {spent:.0f} TokenReviews, {codes.count(429)} answered 429")


def test_the_same_refused_token_is_reviewed_once(target: Target) -> None:
    tampered = forge(target.token, jti="tampered")
    reviews = target.reviews()
    codes = [target.post(tampered)[0] for _ in range(20)]
    assert codes == [401] * 20
    assert target.reviews() - reviews == 1


# --- slow connections


async def _hold_slow_connections(port: int, sources: list[str]) -> tuple[int, int]:
    """Open one TLS connection per item of `sources` (a local address), all at once, each sending half a
    request and then trickling header bytes; wait until the server has closed every one (bounded).
    Returns (connections opened, refused before TLS was done)."""
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    refused = 0

    async def open_one(addr: str) -> None:
        nonlocal refused
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=insecure(), local_addr=(addr, 0)), 60
            )
            writer.write(b"POST /v1/namespaces/x/finetunejobs/y/progress HTTP/1.1\r\nHost: x\r\n")
            opened.append((reader, writer))
        except (ConnectionError, ssl.SSLError, TimeoutError):
            refused += 1

    await asyncio.gather(*(open_one(addr) for addr in sources))

    async def trickle_until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not reader.at_eof():
                writer.write(b"X")
                await writer.drain()
                try:
                    if not await asyncio.wait_for(reader.read(1024), 1.0):
                        break
                except TimeoutError:
                    continue
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    limit = HANDSHAKE_TIMEOUT_SECONDS + HEADER_TIMEOUT_SECONDS + 30
    await asyncio.wait_for(asyncio.gather(*(trickle_until_closed(r, w) for r, w in opened)), limit)
    return len(opened), refused


def test_slow_connections_are_capped_and_cut_off(target: Target) -> None:
    """400 half-sent requests (40 from one address, 360 from 18 others): never more than MAX_CONNECTIONS held
    nor MAX_CONNECTIONS_PER_SOURCE from one address, each closed by the server within the header deadline,
    and the endpoint works afterwards."""
    assert target.operator.proc is not None
    pid = target.operator.proc.pid
    before = rss_mb(pid)
    sources = ["127.0.0.9"] * 40 + [f"127.0.0.{10 + i}" for i in range(18) for _ in range(20)]
    refused_before = target.metrics().get("finetune_progress_connections_refused_total", {}).get((), 0.0)
    peak = [0.0, 0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            held = target.metrics().get("finetune_progress_connections", {}).get((), 0.0)
            peak[0], peak[1] = max(peak[0], held), max(peak[1], rss_mb(pid))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        opened, refused = asyncio.run(_hold_slow_connections(target.operator.progress_port, sources))
    finally:
        done.set()
        watcher.join(10)
    assert opened + refused == 400
    assert peak[0] <= MAX_CONNECTIONS
    turned_away = target.metrics()["finetune_progress_connections_refused_total"][()] - refused_before
    assert turned_away >= 40 - MAX_CONNECTIONS_PER_SOURCE
    wait_until(
        lambda: target.metrics()["finetune_progress_connections"][()] <= 1, timeout=30, what="slow connections closed"
    )
    assert target.post_spaced(target.token)[0] == 200
    print(
        f"\n400 slow connections: at most {peak[0]:.0f} held (cap {MAX_CONNECTIONS}, "
        f"{MAX_CONNECTIONS_PER_SOURCE} per address), {turned_away:.0f} turned away; "
        f"operator RSS {before:.0f} MB before, "
        f"{peak[1]:.0f} MB at the peak, {rss_mb(pid):.0f} MB after"
    )


# --- reports that break the limits


@pytest.mark.parametrize(
    "raw",
    [
        b'{"progress": {"step": 1, "loss": NaN}}',
        b'{"progress": {"step": 1, "loss": Infinity}}',
        b'{"progress": {"step": 1, "loss": "NaN"}}',
        b'{"progress": {"step": 1, "loss": 1e999}}',
        b'{"progress": {"step": 1, "loss": 1e308}}',
        b'{"progress": {"step": 92233720368547758070}}',
        b'{"progress": {"step": 11, "totalSteps": 10}}',
    ],
    ids=["nan", "infinity", "nan-string", "float-overflow", "loss-1e308", "int-over-int64", "step-beyond-total"],
)
def test_numbers_outside_the_limits_are_400_and_not_stored(target: Target, raw: bytes) -> None:
    code, answer = target.post_spaced(target.token, raw=raw)
    assert (code, answer["reason"]) == (400, "invalid_report")
    assert "progress" not in status(target.cluster, target.namespace)


@pytest.mark.parametrize(
    ("output", "code", "reason"),
    [
        ({"url": "javascript:alert(document.cookie)"}, 400, "invalid_report"),
        ({"url": "https://evil.example.com/acme/demo-adapter"}, 422, "url_not_on_hub"),
        ({"url": "https://huggingface.co/acme/demo-adapter\u0000\u001b[2J\r\n\u0007"}, 400, "invalid_report"),
        ({"url": "https://huggingface.co/" + "a" * 60_000}, 400, "invalid_report"),
        ({"hubRepo": "acme/someone-elses"}, 422, "repo_mismatch"),
        ({"revision": "main\u001b]0;pwned\u0007"}, 400, "invalid_report"),
    ],
    ids=["javascript", "another-host", "control-chars", "60kb", "another-repo", "revision-escape"],
)
def test_output_must_point_at_the_jobs_own_hub_repo(
    target: Target, output: dict[str, Any], code: int, reason: str
) -> None:
    got, answer = target.post_spaced(target.token, body={"output": output})
    assert (got, answer["reason"]) == (code, reason)
    assert "output" not in status(target.cluster, target.namespace)


def test_a_real_push_is_stored_and_describe_prints_it_clean(target: Target) -> None:
    output = {
        "hubRepo": HUB["repoId"],
        "revision": COMMIT,
        "url": f"https://huggingface.co/{HUB['repoId']}/commit/{COMMIT}",
    }
    assert target.post_spaced(target.token, body={"output": output})[0] == 200
    assert status(target.cluster, target.namespace)["output"] == output
    described = target.cluster.kubectl("-n", target.namespace, "describe", "ftj", "demo").stdout
    assert not any(ch in described for ch in "\x00\x07\x1b\r")


# --- who may report


def test_a_pod_with_the_jobs_label_but_not_of_its_attempt_is_refused(target: Target) -> None:
    rogue = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "rogue",
            "labels": {
                "finetune.dev/job-name": "demo",
                "finetune.dev/attempt": "1",
                "app.kubernetes.io/managed-by": "finetune-operator",
            },
        },
        "spec": {"containers": [{"name": "trainer", "image": "busybox"}], "serviceAccountName": "default"},
    }
    target.cluster.kubectl("-n", target.namespace, "apply", "-f", "-", input=yaml.safe_dump(rogue))
    token = token_for(target.cluster, target.namespace, target.audience, "rogue")
    code, answer = target.post(token)
    assert (code, answer["reason"]) == (403, "not_attempt_pod")
    assert "progress" not in status(target.cluster, target.namespace)
    assert target.post(target.token)[0] == 200  # the real trainer pod still reports


def test_a_deleted_pods_token_is_refused_within_seconds(target: Target) -> None:
    assert target.post(target.token)[0] == 200
    reviews = target.reviews()
    assert target.post_spaced(target.token)[0] == 200
    assert target.reviews() == reviews  # served from the cache of accepted tokens
    target.cluster.kubectl("-n", target.namespace, "delete", "pod", target.pod, "--wait=true", "--timeout=60s")
    gone = time.monotonic()
    refused = wait_until(
        lambda: (c := target.post_spaced(target.token)[0]) != 200 and c,
        timeout=10,
        what="the deleted pod's token refused",
    )
    assert refused in (401, 403)
    print(f"\ndeleted pod's token refused ({refused}) {time.monotonic() - gone:.1f} s after the pod was gone")


def test_an_authenticated_flood_is_rate_limited_and_other_jobs_go_on(target: Target) -> None:
    codes: list[int] = []
    started = time.monotonic()
    flooding = threading.Thread(target=lambda: codes.extend(flood(target, [target.token] * 600)))
    flooding.start()
    apply(target.cluster, target.namespace, job_with_hub("second"))
    wait_phase(target.cluster, target.namespace, "Running", name="second", timeout=60)
    flooding.join(300)
    elapsed = time.monotonic() - started
    assert not flooding.is_alive() and len(codes) == 600
    assert set(codes) <= {200, 429}
    assert codes.count(200) <= 2 + elapsed + 1
    print(f"\n600 authenticated reports in {elapsed:.1f} s: {codes.count(200)} accepted")


@pytest.fixture
def other_namespace(target: Target) -> Iterator[str]:
    name = f"{target.namespace[:50]}-other"
    target.cluster.kubectl("create", "namespace", name)
    wait_until(
        lambda: target.cluster.kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0,
        timeout=30,
        what="default ServiceAccount",
    )
    try:
        yield name
    finally:
        target.cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def test_what_held_still_holds(target: Target, other_namespace: str) -> None:
    cluster, ns = target.cluster, target.namespace
    cluster.kubectl("-n", ns, "create", "serviceaccount", "intruder")
    apply(cluster, ns, job_with_hub("other"))
    wait_phase(cluster, ns, "Running", name="other", timeout=60)
    other_pod = items(cluster, ns, "pods", "finetune.dev/job-name=other")[0]["metadata"]["name"]
    refusals = {
        "no token": (None, 401),
        "garbage": ("not-a-token", 401),
        "another ServiceAccount, unbound": (token_for(cluster, ns, target.audience, account="intruder"), 403),
        "another namespace": (token_for(cluster, other_namespace, target.audience), 403),
        "another job's token": (token_for(cluster, ns, f"finetune.dev/progress/{ns}/other", other_pod), 401),
        "another job's pod with this audience": (token_for(cluster, ns, target.audience, other_pod), 403),
        "not bound to a pod": (token_for(cluster, ns, target.audience), 403),
        "expired (by its claims)": (forge(target.token, exp=int(time.time()) - 3600), 401),
        "tampered": (forge(target.token, jti="x"), 401),
    }
    for what, (token, code) in refusals.items():
        assert target.post(token)[0] == code, what
    bodies = {
        "over 64 KiB": (b'{"progress": {"step": 1}, "x": "' + b"a" * 70_000 + b'"}', 413),
        "nested deep": (b'{"progress": ' * 3000 + b"1" + b"}" * 3000, 400),
        "wrong type": (b'{"progress": {"step": "seven"}}', 400),
        "extra field": (b'{"progress": {"step": 1}, "phase": "Succeeded"}', 400),
    }
    for what, (raw, code) in bodies.items():
        assert target.post_spaced(target.token, raw=raw)[0] == code, what
    assert status(cluster, ns)["phase"] == "Running"
    text = target.operator.metrics()
    assert target.token not in text and "Bearer" not in text
    reasons = {dict(labels)["reason"] for labels in target.metrics().get("finetune_progress_rejected_total", {})}
    assert reasons and reasons <= set(get_args(Reason))
