"""A TCP proxy in front of the kube-apiserver that can cut every connection through it at once.

TLS passes through untouched (the serving certificate is for 127.0.0.1, whatever the port), so a
client whose kubeconfig points at the proxy talks to the real apiserver. `cut()` closes both ends of
every open connection, which is what a client sees when a load balancer or NAT drops its long-lived
watch streams (and any keep-alive connection); new connections are accepted as before.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import yaml


class ApiProxy:
    """Forward 127.0.0.1:<port> to <target_host>:<target>; `cut()` drops every open connection."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.target_host = target_host
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.accepted = 0
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="api-proxy").start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.target_host, self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                self.open |= {client, upstream}
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src, dst)

    def _close(self, *socks: socket.socket) -> None:
        with self.lock:
            for s in socks:
                self.open.discard(s)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def cut(self) -> int:
        """Close every connection open now (both ends); returns how many sockets were closed."""
        with self.lock:
            socks = list(self.open)
        self._close(*socks)
        return len(socks)

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        self.cut()

    def kubeconfig(self, original: Path, out: Path) -> Path:
        """A copy of `original` whose server is this proxy."""
        config = yaml.safe_load(original.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        out.write_text(yaml.safe_dump(config))
        out.chmod(0o600)
        return out
