"""The Kubernetes side of `ftjob status`, `ftjob watch` and `ftjob logs`: connect, read, watch, stream logs.

It uses the asyncio Kubernetes client the operator already runs on (`kubernetes_asyncio`), so the CLI needs no
second client library. Responses are read as the API's JSON (`_preload_content=False`), the same dicts
`kubectl get -o json` prints, which is what `screen` and `pods` take.

Following is event-driven: `watch` redraws on each watch event of the FineTuneJob (a watch on its name, resumed
from the last resourceVersion when the server ends it, re-read on 410 Gone); `logs -f` waits for rank 0 of the
current attempt with watches on the job and its pods, streams that pod's log, and moves to the next attempt's
rank 0 when the job restarts. Nothing polls.

Every failure a person can act on (no kubeconfig, a bad one, an unreachable or refusing API server, a missing
job, a pod without a log) ends as `ViewError`, printed as one line, exit status 1.
"""

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from finetune_api import constants
from finetune_operator.view import pods as podsel
from finetune_operator.view.screen import (
    Event,
    History,
    JobView,
    clock,
    render_screen,
    summary_line,
    terminal_exit,
)

REQUEST_TIMEOUT = 20.0
"""Seconds one GET or LIST may take: an unreachable API server is an error, not a hang."""
CONNECT_TIMEOUT = 10.0
"""Seconds to open a connection for a watch or a log stream (which then may stay quiet for long)."""
WATCH_SECONDS = 300
"""How long the server keeps one watch open before the client resumes it from the last resourceVersion."""
RETRY_SECONDS = (1.0, 2.0, 4.0, 8.0, 15.0)
"""Back-off before each retry of a transient answer (`TRANSIENT_STATUSES`); after the last, the error is shown."""
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers that mean "again, shortly": throttling, an API server (re)initialising a resource's storage (as when
its CRD is updated), a proxy's hiccup."""
DRAIN_SECONDS = 10.0
"""After the job moved on (a new attempt, a terminal phase), how long the old pod's log may still run out."""
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class ViewError(Exception):
    """A problem the person running `ftjob` can act on; printed as one line, exit status 1."""


class _NotAnEventError(Exception):
    """A watch stream carried a line that is no watch event (an HTML error page from a proxy, say)."""


@dataclass
class Cluster:
    """An API client, the namespace the command works in, and where the credentials came from."""

    api: client.ApiClient
    namespace: str
    source: str

    @property
    def core(self) -> Any:  # the generated APIs are untyped
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)


def kubeconfig_paths(flag: str | None, environ: Mapping[str, str], home: Path) -> list[str]:
    """The kubeconfig files to merge, in kubectl's order: `--kubeconfig`, `$KUBECONFIG` (a path list), then
    `~/.kube/config`. Empty: none applies (then in-cluster credentials, if any). A named file that is missing
    is an error rather than a silent fall-through to another cluster."""
    if flag:
        if not Path(flag).expanduser().is_file():
            raise ViewError(f"--kubeconfig {flag}: no such file")
        return [str(Path(flag).expanduser())]
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        found = [str(Path(p).expanduser()) for p in listed if Path(p).expanduser().is_file()]
        if not found:
            raise ViewError(f"KUBECONFIG={environ['KUBECONFIG']}: no such file")
        return found
    default = home / ".kube" / "config"
    return [str(default)] if default.is_file() else []


def _in_cluster(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and IN_CLUSTER_NAMESPACE.parent.joinpath("token").is_file()


@contextlib.asynccontextmanager
async def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> AsyncIterator[Cluster]:
    """A `Cluster` for the command's flags; network failures inside the block become `ViewError`s naming the
    API server."""
    configuration = client.Configuration()
    paths = kubeconfig_paths(kubeconfig, os.environ, Path.home())
    context_namespace: str | None = None
    if paths:
        source = f"kubeconfig {os.pathsep.join(paths)}"
        try:
            loader = await config.load_kube_config(config_file=os.pathsep.join(paths), context=context,
                                                   client_configuration=configuration, persist_config=False)
        except Exception as exc:  # the loader raises anything from YAMLError to AssertionError on a bad file
            detail = str(exc) or type(exc).__name__
            raise ViewError(f"{source}: cannot be used: {detail}") from None
        current = loader.current_context or {}
        context_namespace = (current.get("context") or {}).get("namespace")
    elif _in_cluster(os.environ):
        source = "in-cluster ServiceAccount"
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        context_namespace = IN_CLUSTER_NAMESPACE.read_text().strip() or None
    else:
        raise ViewError("no kubeconfig: --kubeconfig not given, KUBECONFIG unset, ~/.kube/config missing, "
                        "and not running in a pod")
    api = client.ApiClient(configuration)
    cluster = Cluster(api=api, namespace=namespace or context_namespace or "default", source=source)
    try:
        yield cluster
    except BrokenPipeError:
        raise
    except ApiException as exc:
        raise ViewError(_api_message(exc, cluster)) from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ViewError(f"cannot reach the API server {cluster.host} ({source}): {exc}") from None
    finally:
        await api.close()


def _status_message(status: int, body: bytes | str | None) -> str:
    """The `message` of a Kubernetes Status body, else the body itself."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or text.strip() or 'no detail'}"


def _api_message(exc: ApiException, cluster: Cluster) -> str:
    if exc.status == 401:
        return f"the API server {cluster.host} refused the credentials of {cluster.source} (HTTP 401)"
    return f"{cluster.host}: {_status_message(exc.status or 0, exc.body or exc.reason)}"


async def _json(call: Callable[[], Awaitable[Any]], what: str, cluster: Cluster) -> dict[str, Any]:
    """The JSON of a request made with `_preload_content=False` (which skips the client's status check);
    `call` is made again after a transient answer."""
    for pause in (*RETRY_SECONDS, None):
        response = await call()
        try:
            data = await response.read()
            status = response.status
        finally:
            response.release()
        if status in TRANSIENT_STATUSES and pause is not None:
            await asyncio.sleep(pause)
            continue
        if status == 404:
            raise ViewError(f"{what} not found in namespace {cluster.namespace}")
        if status == 401:
            raise ViewError(f"the API server {cluster.host} refused the credentials of {cluster.source} (HTTP 401)")
        if not 200 <= status <= 299:
            raise ViewError(f"{what}: {_status_message(status, data)}")
        found: dict[str, Any] = json.loads(data)
        return found
    raise AssertionError("unreachable: the last pass returns or raises")


async def read_job(cluster: Cluster, name: str) -> dict[str, Any]:
    """The FineTuneJob's body; `ViewError` when there is none."""
    call = functools.partial(
        cluster.custom.get_namespaced_custom_object, constants.GROUP, constants.VERSION, cluster.namespace,
        constants.PLURAL, name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
    )
    return await _json(call, f"FineTuneJob {name}", cluster)


async def list_pods(cluster: Cluster, job_name: str) -> dict[str, Any]:
    """The PodList of every pod the job's attempts have (by the operator's job-name label)."""
    call = functools.partial(
        cluster.core.list_namespaced_pod, cluster.namespace, label_selector=podsel.job_selector(job_name),
        _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
    )
    return await _json(call, f"pods of FineTuneJob {job_name}", cluster)


async def job_events(cluster: Cluster, body: Mapping[str, Any]) -> list[Event]:
    """Events about the FineTuneJob, its attempt Jobs and their pods (three LISTs, one per kind)."""
    view = JobView.from_body(body)
    attempt = view.status.attempt
    found: list[Event] = []
    for kind in (constants.KIND, "Job", "Pod"):
        selector = f"involvedObject.kind={kind}"
        if kind == constants.KIND:
            selector += f",involvedObject.name={view.name}"
        elif attempt < 1:
            continue
        listed = await _json(
            functools.partial(cluster.core.list_namespaced_event, cluster.namespace, field_selector=selector,
                              _preload_content=False, _request_timeout=REQUEST_TIMEOUT),
            f"events of {kind} objects", cluster,
        )
        found += [Event.from_body(e) for e in listed.get("items") or []
                  if podsel.event_is_about(e, view.name, attempt)]
    return found


async def _next_event(cluster: Cluster, list_call: Callable[..., Any], *args: Any, resource_version: str,
                      **selectors: Any) -> dict[str, Any] | None:
    """Wait for the first change after `resource_version` on a watch; the object, or None when the watch had to
    start over (410 Gone: the caller re-reads). Server-side timeouts are resumed and transient answers retried
    after a pause, so this waits for a change."""
    version = resource_version
    pauses = iter(RETRY_SECONDS)
    while True:
        stream = watch.Watch()
        try:
            async for event in stream.stream(
                list_call, *args, resource_version=version, timeout_seconds=WATCH_SECONDS,
                allow_watch_bookmarks=True, _request_timeout=(CONNECT_TIMEOUT, WATCH_SECONDS + 30), **selectors,
            ):
                if not isinstance(event, dict):
                    raise _NotAnEventError(str(event)[:200])
                raw: dict[str, Any] = event["raw_object"]
                version = raw.get("metadata", {}).get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                if event["type"] == "DELETED":
                    raw["deleted"] = True
                return raw
        except ApiException as exc:
            if exc.status == 410:
                return None
            pause = next(pauses, None) if exc.status in TRANSIENT_STATUSES else None
            if pause is None:
                raise
            await asyncio.sleep(pause)
        except _NotAnEventError as exc:
            pause = next(pauses, None)
            if pause is None:
                raise ViewError(f"a watch got an answer that is not a watch event: {exc}") from None
            await asyncio.sleep(pause)
        finally:
            await stream.close()


async def next_job_change(cluster: Cluster, name: str, resource_version: str) -> dict[str, Any] | None:
    """The FineTuneJob after its next change (`deleted` set when it was deleted); None: re-read it."""
    return await _next_event(
        cluster, cluster.custom.list_namespaced_custom_object, constants.GROUP, constants.VERSION,
        cluster.namespace, constants.PLURAL, resource_version=resource_version,
        field_selector=f"metadata.name={name}",
    )


def terminal_size(out: TextIO) -> os.terminal_size:
    """The size of the terminal `out` writes to, asked of the terminal itself: COLUMNS and LINES in the
    environment (which `shutil.get_terminal_size` prefers) are fixed when a shell exports them and would not
    follow a resize."""
    try:
        return os.get_terminal_size(out.fileno())
    except (OSError, ValueError):
        return shutil.get_terminal_size()


# --- ftjob status ----------------------------------------------------------------------------------------


async def show_status(cluster: Cluster, name: str, out: TextIO, *, color: bool) -> int:
    body = await read_job(cluster, name)
    events = await job_events(cluster, body)
    width = terminal_size(out).columns if color else 10_000
    out.write(render_screen(body, events, now=datetime.now(UTC), width=width, color=color) + "\n")
    return 0


# --- ftjob watch -----------------------------------------------------------------------------------------


@dataclass
class LineSink:
    """Piped output: one stamped summary line per change of what the line shows."""

    out: TextIO
    last: str | None = None

    async def show(self, cluster: Cluster, body: Mapping[str, Any], history: History) -> None:
        line = summary_line(body)
        if line != self.last:
            self.out.write(f"{clock(datetime.now(UTC))} {line}\n")
            self.out.flush()
            self.last = line

    def close(self) -> None:
        pass


@dataclass
class ScreenSink:
    """A terminal: the status screen redrawn in place on the alternate screen; at the end the last screen is
    printed to the normal one, so it stays in the scrollback."""

    out: TextIO
    last: str = ""
    _open: bool = field(default=False)
    _frame: tuple[Mapping[str, Any], list[Event], History] | None = None

    async def show(self, cluster: Cluster, body: Mapping[str, Any], history: History) -> None:
        self._frame = (body, await job_events(cluster, body), history)
        if not self._open:
            self.out.write("\x1b[?1049h\x1b[?25l")  # alternate screen, hide the cursor
            self._open = True
            asyncio.get_running_loop().add_signal_handler(signal.SIGWINCH, self._draw)
        self._draw()

    def _draw(self) -> None:
        """Draw the last frame at the terminal's size now; also on SIGWINCH, so a resize redraws at once."""
        if self._frame is None:
            return
        body, events, history = self._frame
        size = terminal_size(self.out)
        text = render_screen(body, events, history, now=datetime.now(UTC), width=size.columns, color=True)
        lines = text.split("\n")[: max(size.lines - 1, 1)]
        self.out.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in lines) + "\x1b[J")
        self.out.flush()
        self.last = text

    def close(self) -> None:
        """Leave the alternate screen and print the last screen once (closing twice prints nothing more)."""
        if self._open:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGWINCH)
            self.out.write("\x1b[?25h\x1b[?1049l")
            self._open = False
        if self.last:
            self.out.write(self.last + "\n")
            self.last = ""
        self.out.flush()


async def watch_job(cluster: Cluster, name: str, sink: LineSink | ScreenSink) -> int:
    """Show the job, then again on every watch event, until it is Succeeded (0), Failed or deleted (1)."""
    history = History()
    body = await read_job(cluster, name)
    try:
        while True:
            history.observe(JobView.from_body(body).status.progress)
            await sink.show(cluster, body, history)
            code = terminal_exit(body)
            if code is not None:
                return code
            changed = await next_job_change(cluster, name, body["metadata"]["resourceVersion"])
            if changed is not None and changed.get("deleted"):
                sink.close()
                print(f"ftjob watch: FineTuneJob {cluster.namespace}/{name} was deleted", file=sys.stderr)
                return 1
            body = changed if changed is not None else await read_job(cluster, name)
    finally:
        sink.close()


# --- ftjob logs ------------------------------------------------------------------------------------------


async def stream_log(cluster: Cluster, pod: Mapping[str, Any], out: BinaryIO, *, follow: bool) -> None:
    """Copy the trainer container's log of `pod` to `out`; with `follow`, until the container ends."""
    name = pod["metadata"]["name"]
    response = await cluster.core.read_namespaced_pod_log(
        name, cluster.namespace, container=constants.TRAINER_CONTAINER, follow=follow,
        _preload_content=False, _request_timeout=(CONNECT_TIMEOUT, None) if follow else REQUEST_TIMEOUT,
    )
    try:
        if not 200 <= response.status <= 299:
            raise ViewError(f"log of pod {name}: {_status_message(response.status, await response.read())}")
        async for chunk in response.content.iter_any():
            out.write(chunk)
            out.flush()
    finally:
        response.release()


def _announce(pod: Mapping[str, Any], attempt: int) -> None:
    print(f"==> pod {pod['metadata']['name']} (attempt {attempt}, rank 0) <==", file=sys.stderr, flush=True)


async def print_logs(cluster: Cluster, name: str, out: BinaryIO) -> int:
    """The log of rank 0 of the current attempt, as it is now."""
    body = await read_job(cluster, name)
    view = JobView.from_body(body)
    attempt = view.status.attempt
    if attempt < 1:
        raise ViewError(f"FineTuneJob {name} has not started an attempt yet (phase {view.phase})")
    pod = podsel.rank0_pod((await list_pods(cluster, name)).get("items") or [], name, attempt)
    if pod is None:
        raise ViewError(f"attempt {attempt} of FineTuneJob {name} has no rank-0 pod (phase {view.phase})")
    if not podsel.started(pod):
        raise ViewError(f"pod {pod['metadata']['name']} (attempt {attempt}, rank 0) has not started yet")
    _announce(pod, attempt)
    await stream_log(cluster, pod, out, follow=False)
    return 0


async def _first(*waits: Awaitable[Any]) -> None:
    """Return when the first of `waits` finishes (its error raised); cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def follow_logs(cluster: Cluster, name: str, out: BinaryIO) -> int:
    """Follow rank 0 of the current attempt; on a restart, rank 0 of the next one. Ends once the job is in a
    terminal phase and the last rank-0 log has run out (status 0), or when the job is deleted (1)."""
    streamed: set[str] = set()  # uids of pods whose log ran to its end
    while True:
        body = await read_job(cluster, name)
        view = JobView.from_body(body)
        attempt = view.status.attempt
        listed = await list_pods(cluster, name)
        pod = podsel.rank0_pod(listed.get("items") or [], name, attempt) if attempt >= 1 else None
        if pod is not None and podsel.started(pod) and pod["metadata"]["uid"] not in streamed:
            _announce(pod, attempt)
            log = asyncio.ensure_future(stream_log(cluster, pod, out, follow=True))
            moved = asyncio.ensure_future(_until_moved_on(cluster, name, body, attempt))
            await _first(asyncio.shield(log), moved)
            if not log.done():  # the job moved on first: let the old pod's last lines through
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(log), DRAIN_SECONDS)
                log.cancel()
                await asyncio.gather(log, return_exceptions=True)
            else:
                log.result()
            streamed.add(pod["metadata"]["uid"])
            continue
        if terminal_exit(body) is not None:
            if not streamed:
                raise ViewError(f"FineTuneJob {name} is {view.phase} and attempt {attempt} has no rank-0 pod left")
            return 0
        # Wait for the next change of the job or of any of its pods, then look again.
        await _first(
            next_job_change(cluster, name, body["metadata"]["resourceVersion"]),
            _next_event(cluster, cluster.core.list_namespaced_pod, cluster.namespace,
                        resource_version=listed["metadata"]["resourceVersion"],
                        label_selector=podsel.job_selector(name)),
        )


async def _until_moved_on(cluster: Cluster, name: str, body: Mapping[str, Any], attempt: int) -> None:
    """Return once the job has another attempt than `attempt`, a terminal phase, or is gone."""
    while True:
        view = JobView.from_body(body)
        if view.status.attempt != attempt or terminal_exit(body) is not None:
            return
        changed = await next_job_change(cluster, name, body["metadata"]["resourceVersion"])
        if changed is not None and changed.get("deleted"):
            return
        body = changed if changed is not None else await read_job(cluster, name)


# --- entry point -----------------------------------------------------------------------------------------


async def _main(args: Any) -> int:
    async with connect(args.kubeconfig, args.context, args.namespace) as cluster:
        if args.command == "status":
            return await show_status(cluster, args.job, sys.stdout, color=sys.stdout.isatty())
        if args.command == "watch":
            sink = ScreenSink(sys.stdout) if sys.stdout.isatty() else LineSink(sys.stdout)
            return await watch_job(cluster, args.job, sink)
        if args.follow:
            return await follow_logs(cluster, args.job, sys.stdout.buffer)
        return await print_logs(cluster, args.job, sys.stdout.buffer)


def run(args: Any) -> int:
    """`ftjob status|watch|logs`: run the command; one line on stderr and status 1 for a `ViewError`, 130 for
    Ctrl-C (after the terminal is restored)."""
    try:
        return asyncio.run(_main(args))
    except ViewError as exc:
        print(f"ftjob {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `ftjob logs JOB | head`: the reader left; so do we, quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's flush at exit must not fail again
        return 0
