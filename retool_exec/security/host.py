"""The host side of the audit: what it plants, what it listens for, what it cleans up.

:class:`HostFixtures` opens the listeners network cases aim at (TCP and UDP on
127.0.0.1, an abstract unix socket), sets a canary variable in this process's
environment and writes a world-readable secret file, all for the duration of
a run, and finds what a case left behind on the host: processes named after
the case's token, files in ``/tmp`` and ``/dev/shm``, SysV segments and POSIX
queues. Only the local backend can leave such things; it is the only one the
audit cleans up after, killing by pid only processes that carry the token.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import secrets
import selectors
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import retool_exec
from retool_exec.backends.docker.agent import trees
from retool_exec.security.model import HostFacts

__all__ = ["CANARY_NAME", "HostFixtures", "Leftover", "new_token"]

CANARY_NAME = "RETOOL_EXEC_AUDIT_CANARY"
SCRATCH_DIRS = ("/tmp", "/dev/shm")
PR_SET_CHILD_SUBREAPER = 36
_MAX_RECORD = 512
_TOKEN_NAME = re.compile(r"rx[0-9a-f]{10}")


def new_token() -> str:
    """A run's unique token: short enough to be a process name (15 characters at most)."""
    return "rx" + secrets.token_hex(5)


Leftover = str
"""A description of one thing a case left on the host."""


class _Listeners:
    """TCP, UDP and abstract-unix listeners on a thread; records what they hear."""

    def __init__(self, unix_name: str) -> None:
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + unix_name)
        self.unix.listen(16)
        self._wake_r, self._wake_w = socket.socketpair()
        self._heard: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="retool-audit-listen", daemon=True)
        self._thread.start()

    @property
    def ports(self) -> tuple[int, int]:
        return self.tcp.getsockname()[1], self.udp.getsockname()[1]

    def heard(self, token: str) -> frozenset[str]:
        needle = token.encode()
        with self._lock:
            return frozenset(kind for kind, data in self._heard if needle in data)

    def _record(self, kind: str, data: bytes) -> None:
        with self._lock:
            self._heard.append((kind, data[:_MAX_RECORD]))

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        for server in (self.tcp, self.unix):
            server.setblocking(False)
            selector.register(server, selectors.EVENT_READ, "accept")
        selector.register(self.udp, selectors.EVENT_READ, "udp")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        buffers: dict[socket.socket, tuple[str, bytearray]] = {}
        try:
            while not self._stop:
                for key, _ in selector.select(timeout=0.5):
                    if key.data == "wake":
                        return
                    ready = key.fileobj
                    if not isinstance(ready, socket.socket):
                        continue
                    sock = ready
                    if key.data == "accept":
                        with contextlib.suppress(OSError):
                            conn, _ = sock.accept()
                            conn.setblocking(False)
                            kind = "tcp" if sock is self.tcp else "unix"
                            buffers[conn] = (kind, bytearray())
                            selector.register(conn, selectors.EVENT_READ, "conn")
                    elif key.data == "udp":
                        with contextlib.suppress(OSError):
                            self._record("udp", sock.recv(_MAX_RECORD))
                    else:
                        kind, buffer = buffers[sock]
                        try:
                            data = sock.recv(_MAX_RECORD)
                        except OSError:
                            data = b""
                        buffer += data
                        if not data or len(buffer) >= _MAX_RECORD or b"\n" in data:
                            self._record(kind, bytes(buffer))
                            selector.unregister(sock)
                            del buffers[sock]
                            sock.close()
        finally:
            for conn in buffers:
                conn.close()
            selector.close()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        for sock in (self.tcp, self.udp, self.unix, self._wake_r, self._wake_w):
            sock.close()


class HostFixtures:
    """Listeners, a canary and a secret on the host, for the duration of an audit run."""

    def __init__(self) -> None:
        self.run_id = secrets.token_hex(6)
        self.canary_value = "canary-" + secrets.token_hex(16)
        self._listeners: _Listeners | None = None
        self._secret_dir: str | None = None
        self._previous_canary: str | None = None
        self._facts: HostFacts | None = None

    @property
    def facts(self) -> HostFacts:
        if self._facts is None:
            raise RuntimeError("HostFixtures is not entered")
        return self._facts

    def __enter__(self) -> Self:
        unix_name = f"retool-exec-audit-{self.run_id}"
        self._listeners = _Listeners(unix_name)
        self._secret_dir = tempfile.mkdtemp(prefix=f"retool-exec-audit-{self.run_id}-")
        os.chmod(self._secret_dir, 0o755)  # noqa: S103 - readable by anyone on the host, on purpose
        secret = Path(self._secret_dir, "secret.txt")
        secret.write_text(self.canary_value)
        secret.chmod(0o644)
        self._previous_canary = os.environ.get(CANARY_NAME)
        os.environ[CANARY_NAME] = self.canary_value
        tcp_port, udp_port = self._listeners.ports
        self._facts = HostFacts(
            hostname=platform.node(),
            canary_name=CANARY_NAME,
            canary_value=self.canary_value,
            secret_file=str(secret),
            package_dir=str(Path(retool_exec.__file__).resolve().parent),
            tcp_port=tcp_port,
            udp_port=udp_port,
            unix_name=unix_name,
            heard=self._listeners.heard,
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._previous_canary is None:
            os.environ.pop(CANARY_NAME, None)
        else:
            os.environ[CANARY_NAME] = self._previous_canary
        if self._listeners is not None:
            self._listeners.close()
            self._listeners = None
        if self._secret_dir is not None:
            shutil.rmtree(self._secret_dir, ignore_errors=True)
            self._secret_dir = None
        self._facts = None

    # -- leftovers ---------------------------------------------------------------------

    @staticmethod
    @contextlib.contextmanager
    def adopting_orphans() -> Iterator[None]:
        """Reap what the local backend's calls orphan, as a well-behaved init would.

        This process becomes the subreaper of its descendants, so orphans come
        here rather than to the host's init (which on some hosts never reaps),
        and a thread reaps the zombies among them that carry a case token.
        Only token-named processes are reaped: the event loop's own children
        (the calls' main processes) are never named, so their exit statuses
        stay with the loop.
        """
        libc = ctypes.CDLL(None, use_errno=True)
        enabled = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        stop = threading.Event()

        def reap() -> None:
            while not stop.wait(0.05):
                for pid, state, parent in _token_processes():
                    if state == "Z" and parent == os.getpid():
                        with contextlib.suppress(ChildProcessError, OSError):
                            os.waitpid(pid, os.WNOHANG)

        reaper = threading.Thread(target=reap, name="retool-audit-reaper", daemon=True)
        reaper.start()
        try:
            yield
        finally:
            stop.set()
            reaper.join(timeout=5)
            if enabled:
                libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def leftovers(self, token: str) -> list[Leftover]:
        """What the run named ``token`` left on this host."""
        found = [f"process {pid} ({state})" for pid, state, _ in _named_processes(token)]
        for directory in SCRATCH_DIRS:
            with contextlib.suppress(OSError):
                found += [f"{directory}/{name}" for name in os.listdir(directory) if token in name]
        if _sysv_segment(token) is not None:
            found.append("SysV shared-memory segment")
        return found

    async def await_leftovers(self, token: str, *, wait: float) -> list[Leftover]:
        """Leftovers still there after up to ``wait`` seconds (containers take a moment to go)."""
        import asyncio

        deadline = time.monotonic() + wait
        while True:
            found = self.leftovers(token)
            if not found or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(0.1)

    def clean(self, token: str) -> None:
        """Remove what a local run named ``token`` left: kill, reap, delete."""
        for _ in range(60):  # a pid hopper may take a few rounds to catch
            processes = _named_processes(token)
            if not processes:
                break
            for pid, state, parent in processes:
                if state != "Z":
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                elif parent == os.getpid():
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        for directory in SCRATCH_DIRS:
            with contextlib.suppress(OSError):
                for name in os.listdir(directory):
                    if token in name:
                        _remove(os.path.join(directory, name))
        shmid = _sysv_segment(token)
        if shmid is not None:
            ctypes.CDLL(None).shmctl(shmid, 0, None)  # IPC_RMID
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).mq_unlink(f"/{token}".encode())


def _processes(match: Callable[[str], bool]) -> list[tuple[int, str, int]]:
    """(pid, state, parent) of every process on this host whose name ``match``es."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        if match(stat[stat.find("(") + 1 : stat.rfind(")")]):
            fields = stat.rpartition(")")[2].split()
            found.append((int(entry), fields[0], int(fields[1])))
    return found


def _named_processes(token: str) -> list[tuple[int, str, int]]:
    """Processes on this host named ``token``."""
    return _processes(lambda name: name == token)


def _token_processes() -> list[tuple[int, str, int]]:
    """Processes on this host named like any case token."""
    return _processes(lambda name: _TOKEN_NAME.fullmatch(name) is not None)


def _sysv_segment(token: str) -> int | None:
    """The id of the SysV segment a case keyed on ``token`` (see iso-sysv-ipc), if any."""
    key = int(token[2:9], 16)
    try:
        with open("/proc/sysvipc/shm") as handle:
            next(handle, None)
            for line in handle:
                fields = line.split()
                if len(fields) > 1 and int(fields[0]) == key:
                    return int(fields[1])
    except (OSError, ValueError):
        pass
    return None


def _remove(path: str) -> None:
    """Delete a file or a tree a case planted, whatever its permissions or links."""
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    trees.remove_tree(path)  # no recursion: a case may plant a tree thousands deep
