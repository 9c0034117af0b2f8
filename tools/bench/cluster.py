"""The NATS JetStream cluster ``tools.bench.replication`` runs on, and the processes it starts.

Three ``nats-server`` (from the venv) routed to each other on loopback, on free ports, their store
directories under a directory of the caller's; every process started through ``spawn`` dies with
this one and is stopped at exit (only those are ever killed)."""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

NATS_SERVER = os.path.join(os.path.dirname(sys.executable), "nats-server")
RAW_STREAM = "RAWPUB"


# ── processes we start (and only those are ever killed) ──────────────────────

_STARTED: list[subprocess.Popen[Any]] = []


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it should this process die (even by SIGKILL)."""

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    process = subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs)
    _STARTED.append(process)
    return process


def kill_started() -> None:
    for process in _STARTED:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 5
    for process in _STARTED:
        if process.poll() is None:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


atexit.register(kill_started)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ── the cluster ──────────────────────────────────────────────────────────────


async def _quiet(error: Exception) -> None:
    """nats-py's error callback while the cluster starts (refused connections are expected)."""


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Cluster:
    """Three JetStream servers routed to each other on loopback."""

    def __init__(self, base: str, size: int = 3) -> None:
        self.base, self.size = base, size
        ports = _free_ports(2 * size)
        self.client_ports, self.cluster_ports = ports[:size], ports[size:]
        self.processes: list[subprocess.Popen[Any]] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    def start(self) -> None:
        routes = ", ".join(f'"nats-route://127.0.0.1:{port}"' for port in self.cluster_ports)
        for index in range(self.size):
            directory = os.path.join(self.base, f"n{index}")
            os.makedirs(directory)
            config = os.path.join(directory, "server.conf")
            with open(config, "w") as handle:
                handle.write(
                    f'server_name: "n{index}"\n'
                    f"listen: 127.0.0.1:{self.client_ports[index]}\n"
                    f'jetstream {{ store_dir: "{directory}/js" }}\n'
                    f"cluster {{ name: bench, listen: 127.0.0.1:{self.cluster_ports[index]}, routes: [{routes}] }}\n"
                )
            log = open(os.path.join(directory, "server.log"), "w")
            self.processes.append(
                spawn([NATS_SERVER, "-c", config], stdout=log, stderr=subprocess.STDOUT)
            )
            log.close()

    async def ready(self, timeout: float = 60.0) -> None:
        """Until an R3 stream can be made (a meta leader and all peers known); makes the raw
        publish stream."""

        import nats
        from nats.js.api import StorageType, StreamConfig

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"nats-server exited with {process.returncode} (logs in {self.base})"
                    )
            try:
                nc = await nats.connect(
                    servers=self.urls,
                    connect_timeout=1,
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    error_cb=_quiet,
                )
                try:
                    js = nc.jetstream(timeout=2)
                    await js.add_stream(
                        StreamConfig(
                            name=RAW_STREAM,
                            subjects=["rawpub.>"],
                            num_replicas=3,
                            storage=StorageType.FILE,
                        )
                    )
                    await js.publish("rawpub.ready", b"x")
                    return
                finally:
                    await nc.close()
            except Exception as error:
                last = error
                await asyncio.sleep(0.5)
        raise RuntimeError(f"The cluster was not ready in {timeout} s: {last!r}")

    def cpu(self) -> float:
        """CPU seconds the servers used so far (user + system, from /proc; 0 where unreadable)."""

        total = 0.0
        for process in self.processes:
            try:
                with open(f"/proc/{process.pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
        return total

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def nats_version() -> str:
    try:
        return subprocess.run(
            [NATS_SERVER, "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nats-server"
