"""A hang's flight-recorder dumps from every rank of a pool, wherever the ranks run: one machine, or the nodes of a
Slurm allocation (no shared file system needed).

The kernel listens (``Collector``); each rank starts a thread (``serve``) that connects, says its rank and waits. On
``collect`` the kernel asks every rank at once; each rank's thread writes its dump (``coursekit.profiling.frwrap.
dump``: the recorder's entries, and where the main thread was — that thread may sit inside a collective, which
releases the GIL) into a folder on its own node and sends the files back, which the kernel writes into one folder
for ``coursekit.profiling.hangs`` to read.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

from coursekit.profiling import frwrap

_HEADER = struct.Struct("!Q")


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the other side closed the connection")
            buf += chunk
        return buf

    return exactly(_HEADER.unpack(exactly(_HEADER.size))[0])


class Collector:
    """The kernel's side: a listening socket (``host``: 127.0.0.1 for local ranks, every interface for an
    allocation's) that every rank's ``serve`` thread joins."""

    def __init__(self, host: str = "127.0.0.1"):
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        self.ranks: dict[int, socket.socket] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="coursekit-pool-dumps", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
                rank = int(_recv(conn))
            except (OSError, ValueError, ConnectionError):  # closed (the pool stopped), or a stranger
                if self._server.fileno() == -1:
                    return
                continue
            with self._lock:
                self.ranks[rank] = conn

    def collect(self, folder: Path, timeout: float) -> list[int]:
        """Ask every rank for its dump and write the files into ``folder``; the ranks that answered in time."""
        with self._lock:
            ranks = dict(self.ranks)
        for conn in ranks.values():
            _send(conn, b"dump")
        answered, end = [], time.monotonic() + timeout
        for rank, conn in sorted(ranks.items()):
            conn.settimeout(max(0.1, end - time.monotonic()))
            try:
                for name in json.loads(_recv(conn)):
                    (Path(folder) / Path(name).name).write_bytes(_recv(conn))
                answered.append(rank)
            except (OSError, ConnectionError, ValueError):  # that rank could not dump in time: diagnose without it
                continue
        return answered

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for conn in self.ranks.values():
                conn.close()
            self.ranks.clear()


def serve(host: str, port: int, rank: int) -> None:
    """Runs in each rank (the pool's set-up): a daemon thread that answers the kernel's requests for a dump."""
    folder = Path(os.environ[frwrap.DIR_ENV])
    folder.mkdir(parents=True, exist_ok=True)  # on another node the kernel's folder name is a new local folder
    sock = socket.create_connection((host, port), timeout=30)
    sock.settimeout(None)
    _send(sock, str(rank).encode())

    def answer() -> None:
        while True:
            try:
                if _recv(sock) != b"dump":
                    continue
            except (OSError, ConnectionError):  # the pool closed
                return
            frwrap.dump("stuck")
            files = sorted(folder.glob(f"fr_trace_{rank}.*"))
            _send(sock, json.dumps([f.name for f in files]).encode())
            for f in files:
                _send(sock, f.read_bytes())

    threading.Thread(target=answer, name="coursekit-pool-fr", daemon=True).start()
