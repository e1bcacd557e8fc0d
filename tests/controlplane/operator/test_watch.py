"""`ftjob status`, `ftjob watch` and `ftjob logs` against the real control plane.

`status` and `logs` read what the operator made (its status, plan, events, the attempt's pods and their
labels). `watch` is driven by patching the FineTuneJob's status subresource from the test, with no operator
running, so each change is one the test chose: one printed line per change the line shows, none for a change
it does not show, and the exit status of the terminal phase. The live terminal form runs in tmux, whose pane
the test reads back as a person would see it.

KWOK pods run nothing, so no kubelet serves their logs: here `logs` is checked up to the pod it picks (rank 0
of the current attempt, named on stderr); the log itself is read on the real node, when one is up.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import Cluster, wait_until
from .conftest import FTJOB, Operator, apply, ftj, get, items, wait_phase


def ftjob(cluster: Cluster, *args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`ftjob ARGS` with the cluster's kubeconfig in KUBECONFIG (as a user's shell would have it)."""
    environ = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), **(env or {})}
    return subprocess.run([str(FTJOB), *args], capture_output=True, text=True, env=environ, timeout=timeout)


def patch_status(cluster: Cluster, namespace: str, status: dict[str, Any], name: str = "demo") -> None:
    cluster.kubectl("-n", namespace, "patch", "finetunejob", name, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))


class Piped:
    """`ftjob watch` with stdout on a pipe; its lines arrive on a queue as they are printed."""

    def __init__(self, cluster: Cluster, *args: str) -> None:
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        self.proc = subprocess.Popen([str(FTJOB), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next_line(self, timeout: float = 20) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no new line from ftjob watch in {timeout}s; so far: {self.seen}") from None
        self.seen.append(line)
        return line

    def no_line_for(self, seconds: float) -> None:
        with pytest.raises(queue.Empty):
            self.seen.append(self.lines.get(timeout=seconds))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def piped() -> Iterator[list[Piped]]:
    started: list[Piped] = []
    yield started
    for p in started:
        p.stop()


def body_of(line: str) -> str:
    """The line without its clock stamp."""
    return line.split(" ", 1)[1]


# --- status ----------------------------------------------------------------------------------------------


def test_status_shows_phase_attempt_plan_conditions_and_events(cluster: Cluster, namespace: str,
                                                               operator: Operator) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True))
    st = wait_phase(cluster, namespace, "Running", timeout=30)
    wait_until(lambda: get(cluster, namespace, "events", "--field-selector", "involvedObject.kind=Pod")["items"],
               timeout=30, what="pod events")
    proc = ftjob(cluster, "status", "demo", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"FineTuneJob {namespace}/demo   Running   attempt 1   nodes ")
    plan = st["plan"]
    assert any(line.startswith(f"Plan       ZeRO-{plan['zeroStage']}, offload {plan['offload']}, ~")
               for line in lines), lines
    assert "Progress   no report from the trainer yet" in lines
    running = next(c for c in st["conditions"] if c["type"] == "Running")
    assert any(line.split()[:3] == ["Running", "True", running["reason"]] for line in lines), lines
    events = lines[lines.index(next(x for x in lines if x.startswith("Events (last "))) + 1:]
    assert any(" Pod/demo-1-0-" in e for e in events), events  # the attempt's pods' events are there too


def test_status_reads_the_namespace_and_kubeconfig_like_kubectl(cluster: Cluster, namespace: str, crd: None,
                                                                tmp_path: Path) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    # The context's namespace applies without -n; --kubeconfig wins over a KUBECONFIG that points nowhere.
    config = tmp_path / "kubeconfig"
    raw = json.loads(cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
    raw["contexts"][0]["context"]["namespace"] = namespace
    config.write_text(json.dumps(raw))
    proc = ftjob(cluster, "status", "demo", "--kubeconfig", str(config), env={"KUBECONFIG": "/nonexistent"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"FineTuneJob {namespace}/demo   Pending   attempt 0")


def test_status_of_a_missing_job_exits_1_with_a_clear_message(cluster: Cluster, namespace: str,
                                                              crd: None) -> None:
    proc = ftjob(cluster, "status", "nope", "-n", namespace)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == f"ftjob status: FineTuneJob nope not found in namespace {namespace}\n"


def test_bad_kubeconfigs_are_clear_errors(cluster: Cluster, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_text("this: [is not a kubeconfig\n")
    proc = ftjob(cluster, "status", "demo", "--kubeconfig", str(garbage))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"ftjob status: kubeconfig {garbage}: cannot be used: ")
    assert "Traceback" not in proc.stderr

    proc = ftjob(cluster, "watch", "demo", "--kubeconfig", str(tmp_path / "missing"))
    assert (proc.returncode, proc.stderr) == (1, f"ftjob watch: --kubeconfig {tmp_path / 'missing'}: no such file\n")

    unreachable = json.loads(cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
    unreachable["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"  # discard port: nothing listens
    dead = tmp_path / "dead"
    dead.write_text(json.dumps(unreachable))
    proc = ftjob(cluster, "logs", "demo", "--kubeconfig", str(dead))
    assert proc.returncode == 1
    assert proc.stderr.startswith("ftjob logs: cannot reach the API server https://127.0.0.1:9 (kubeconfig ")
    assert "Traceback" not in proc.stderr

    forged = json.loads(cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
    user = forged["users"][0]["user"]
    for key in ("client-certificate-data", "client-key-data"):
        user.pop(key, None)
    user["token"] = "not-a-token"
    bad_user = tmp_path / "bad-user"
    bad_user.write_text(json.dumps(forged))
    proc = ftjob(cluster, "status", "demo", "--kubeconfig", str(bad_user))
    assert proc.returncode == 1
    assert "refused the credentials of kubeconfig" in proc.stderr and "(HTTP 401)" in proc.stderr


# --- watch -----------------------------------------------------------------------------------------------


def _progress(step: int, loss: float) -> dict[str, Any]:
    return {"progress": {"step": step, "totalSteps": 30, "loss": loss}}


def test_watch_piped_prints_a_line_per_change_and_exits_1_when_failed(cluster: Cluster, namespace: str,
                                                                      crd: None, piped: list[Piped]) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    patch_status(cluster, namespace, {"phase": "Running", "attempt": 1})
    watch = Piped(cluster, "watch", "demo", "-n", namespace)
    piped.append(watch)
    assert body_of(watch.next_line()) == "Running attempt=1"
    patch_status(cluster, namespace, _progress(5, 2.5))
    assert body_of(watch.next_line()) == "Running attempt=1 step=5/30 (17%) loss=2.5000 eval_loss=-"
    cluster.kubectl("-n", namespace, "label", "finetunejob", "demo", "touched=yes")  # an event, same line
    patch_status(cluster, namespace, _progress(10, 1.75))
    assert body_of(watch.next_line()) == "Running attempt=1 step=10/30 (33%) loss=1.7500 eval_loss=-"
    patch_status(cluster, namespace, {"phase": "Restarting", "attempt": 2, "restarts": 1})
    assert body_of(watch.next_line()).startswith("Restarting attempt=2 step=10/30")
    assert watch.proc.poll() is None
    patch_status(cluster, namespace, {"phase": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "3 attempts failed"}]})
    assert body_of(watch.next_line()).startswith("Failed attempt=2 ")
    assert watch.seen[-1].endswith(" reason=BackoffLimitExceeded")
    assert watch.proc.wait(20) == 1
    watch.no_line_for(0.5)
    assert len(watch.seen) == 5  # the label change printed nothing


def test_watch_follows_the_operator_to_success_and_exits_0(cluster: Cluster, namespace: str, operator: Operator,
                                                           piped: list[Piped]) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", run_seconds=15))  # time for `ftjob` to start on a busy machine
    watch = Piped(cluster, "watch", "demo", "-n", namespace)
    piped.append(watch)
    assert watch.proc.wait(90) == 0
    while not watch.lines.empty():
        watch.next_line()
    phases = [body_of(line).split()[0] for line in watch.seen]
    assert phases[-1] == "Succeeded", watch.seen
    assert "Running" in phases
    assert watch.seen[-1].split(" ", 2)[2].startswith("attempt=1 ")
    assert len(set(watch.seen)) == len(watch.seen)


def test_watch_of_a_deleted_job_exits_1(cluster: Cluster, namespace: str, crd: None, piped: list[Piped]) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    watch = Piped(cluster, "watch", "demo", "-n", namespace)
    piped.append(watch)
    watch.next_line()
    cluster.kubectl("-n", namespace, "delete", "finetunejob", "demo")
    assert watch.proc.wait(20) == 1
    assert watch.proc.stderr is not None
    assert f"FineTuneJob {namespace}/demo was deleted" in watch.proc.stderr.read()


def test_watch_ends_on_ctrl_c(cluster: Cluster, namespace: str, crd: None, piped: list[Piped]) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    watch = Piped(cluster, "watch", "demo", "-n", namespace)
    piped.append(watch)
    watch.next_line()
    watch.proc.send_signal(signal.SIGINT)
    assert watch.proc.wait(20) == 130  # 128 + SIGINT, as a shell reports it
    assert watch.proc.stderr is not None
    assert "Traceback" not in watch.proc.stderr.read()


SCREEN = Path(os.environ.get("FTJOB_WATCH_SCREEN", "/tmp/ftjob-watch-screen.txt"))
"""Where the TTY test leaves the last pane it captured (for people to look at)."""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_in_a_terminal_redraws_in_place_with_a_bar_and_a_loss_curve(cluster: Cluster, namespace: str,
                                                                          crd: None, tmp_path: Path) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    patch_status(cluster, namespace, {"phase": "Running", "attempt": 1, "conditions": [
        {"type": "Running", "status": "True", "reason": "AllNodesReady", "message": "1/1 node pods running"},
        {"type": "PodsHealthy", "status": "True", "reason": "PodsHealthy", "message": ""}]})
    socket = f"ftjob-watch-{uuid.uuid4().hex[:8]}"
    rc_file = tmp_path / "rc"
    command = (f"KUBECONFIG={cluster.kubeconfig} {FTJOB} watch demo -n {namespace}; echo $? > {rc_file}; "
               "sleep 60")  # keeps the pane (and the final screen) until the test has read it

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, "-f", os.devnull, *args],  # no user config
                              capture_output=True, text=True, check=True).stdout

    tmux("new-session", "-d", "-x", "110", "-y", "30", "-s", "w", "-n", "first", command)
    try:
        def pane() -> str:
            return tmux("capture-pane", "-p", "-t", "w:first")

        # (The first screen may be drawn before tmux gives the pane its size; the next one has it.)
        wait_until(lambda: "Progress   no report from the trainer yet" in pane(), timeout=20, interval=0.2,
                   what="the first screen")
        losses = [2.4, 2.1, 1.9, 1.6, 1.5, 1.3, 1.25, 1.2]
        for i, loss in enumerate(losses, start=1):
            patch_status(cluster, namespace, {"progress": {
                "step": 3 * i, "totalSteps": 30, "loss": loss, "tokensPerSecond": 1500.0 + i,
                "etaSeconds": 10.0 * (10 - i), "updatedAt": "2026-12-01T21:40:03Z"}})
        screen = wait_until(lambda: (lambda p: p if "step 24/30" in p else None)(pane()), timeout=20,
                            interval=0.2, what="the screen after the last report")
        SCREEN.write_text(screen)
        lines = screen.splitlines()
        assert lines[0].startswith(f"FineTuneJob {namespace}/demo   Running   attempt 1")
        assert len([x for x in lines if x.startswith("FineTuneJob ")]) == 1  # redrawn in place, not appended
        assert any(x.startswith("Progress   [" + "█" * 24 + " " * 6 + "]  80.0%  step 24/30") for x in lines)
        assert "Loss       1.2000  █▆▅▃▃▂▁▁   eval -" in lines, lines
        assert "Speed      1.5k tok/s   lr -   ETA 20s   reported 21:40:03Z" in lines
        assert any(x.split()[:3] == ["PodsHealthy", "True", "PodsHealthy"] for x in lines)
        assert not any(x.endswith("…") for x in lines)

        # A narrower terminal: redrawn at once (SIGWINCH), with no change of the job, lines cut to the width.
        tmux("resize-window", "-t", "w:first", "-x", "50")
        narrow = wait_until(lambda: (lambda p: p if "…" in p else None)(pane()), timeout=20, interval=0.2,
                            what="the screen redrawn for 50 columns")
        assert all(len(x) <= 50 for x in narrow.splitlines()), narrow
        assert "  Running      True     AllNodesReady  1/1 node pods running"[:49] + "…" in narrow.splitlines()
        tmux("resize-window", "-t", "w:first", "-x", "110")

        # Ctrl-C in a second window: status 130, the terminal back from the alternate screen, the screen kept.
        interrupted = tmp_path / "rc-interrupted"
        tmux("new-window", "-t", "w", "-n", "second",
             command.replace(str(rc_file), str(interrupted)))
        wait_until(lambda: "step 24/30" in tmux("capture-pane", "-p", "-t", "w:second"), timeout=20, interval=0.2,
                   what="the second watch's screen")
        tmux("send-keys", "-t", "w:second", "C-c")
        wait_until(interrupted.exists, timeout=20, interval=0.2, what="ftjob watch to end on Ctrl-C")
        assert interrupted.read_text().strip() == "130"
        after = tmux("capture-pane", "-p", "-t", "w:second")
        assert "Traceback" not in after
        assert f"FineTuneJob {namespace}/demo   Running   attempt 1" in after

        patch_status(cluster, namespace, {"phase": "Succeeded", "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "Completed", "message": "done"}]})
        wait_until(rc_file.exists, timeout=20, interval=0.2, what="ftjob watch to exit")
        assert rc_file.read_text().strip() == "0"
        final = tmux("capture-pane", "-p", "-t", "w:first")
        assert f"FineTuneJob {namespace}/demo   Succeeded   attempt 1" in final  # left on the normal screen
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


# --- logs ------------------------------------------------------------------------------------------------


def test_logs_picks_rank_0_of_the_current_attempt(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=30)
    pods = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")
    rank0 = next(p["metadata"]["name"] for p in pods
                 if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0")
    assert len(pods) == 2
    proc = ftjob(cluster, "logs", "demo", "-n", namespace)
    # KWOK nodes run no kubelet: the API server cannot fetch the log, and says so.
    assert proc.returncode == 1
    header, error = proc.stderr.splitlines()[:2]
    assert header == f"==> pod {rank0} (attempt 1, rank 0) <=="
    assert error.startswith(f"ftjob logs: log of pod {rank0}: HTTP "), proc.stderr


def test_logs_before_any_attempt_is_a_clear_error(cluster: Cluster, namespace: str, crd: None) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    proc = ftjob(cluster, "logs", "demo", "-n", namespace)
    assert (proc.returncode, proc.stderr) == (
        1, "ftjob logs: FineTuneJob demo has not started an attempt yet (phase Pending)\n")


def test_logs_follow_of_a_finished_job_without_pods_says_so(cluster: Cluster, namespace: str, crd: None) -> None:
    apply(cluster, namespace, ftj("tiny-cpu"))
    patch_status(cluster, namespace, {"phase": "Succeeded", "attempt": 1})
    proc = ftjob(cluster, "logs", "demo", "-n", namespace, "-f")
    assert (proc.returncode, proc.stderr) == (
        1, "ftjob logs: FineTuneJob demo is Succeeded and attempt 1 has no rank-0 pod left\n")
