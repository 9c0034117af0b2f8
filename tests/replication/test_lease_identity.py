"""Who may take a store's lease without ``take_over``.

The lease used to be reclaimed by any writer with the same host name and store path: a second
writer on a cloned VM, or in a container with a fixed host name, opened without ``take_over``,
fenced the subject and deposed the live, renewing writer. Now only the same holder restarted
reclaims early: the same instance id (``instance.id``, created once beside the store) on the same
host and path, *and* a lease nobody renews. The clone here is real: the live writer's store is
copied with its instance id (a VM clone copies the whole disk) and mounted at the same path in a
private mount namespace of a child process, on the same host name."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.stream.lease import INSTANCE_FILE

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)

OPEN = textwrap.dedent(
    """
    import asyncio, sys
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb import LmdbStorage
    from pi_durable_lmdb.errors import DurableLmdbError
    async def main():
        path, url, store, mode = sys.argv[1:5]
        ttl = int(sys.argv[5]) if len(sys.argv) > 5 else 2
        try:
            storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream="CLONE", store=store, lease_ttl=ttl)
        except DurableLmdbError as error:
            print("refused", type(error).__name__, error, flush=True)
            return
        print("opened", storage.replication.epoch, flush=True)
        if mode == "hold":
            await storage.commit([{"type": "conversation", "value": {"id": 777}}], CTX)
            print("committed", flush=True)
            await asyncio.sleep(60)
        await storage.close()
    asyncio.run(main())
    """
)


def in_namespace(clone: Path, path: Path, *args: str) -> list[str]:
    """A child that sees ``clone`` at ``path`` (a private mount namespace, same host name)."""

    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return [
        "unshare",
        "-m",
        "sh",
        "-c",
        script,
        "sh",
        str(clone),
        str(path),
        sys.executable,
        "-c",
        OPEN,
        str(path),
        *args,
    ]


@pytest.fixture
def namespaces() -> None:
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip(
            f"no private mount namespaces here (unshare -m: {probe.stderr.decode().strip()})"
        )


async def test_a_clone_of_a_live_writer_is_refused_and_the_writer_goes_on(
    tmp_path: Path, nats_server: NatsNode, namespaces: None
) -> None:
    path, clone = tmp_path / "store", tmp_path / "clone"
    writer = await LmdbStorage.open(
        path, durability="replicated", nats=nats_server.url, stream="CLONE", lease_ttl=2
    )
    try:
        first = await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        store = writer.store_id
        assert store is not None and (path / INSTANCE_FILE).is_file()
        clone.mkdir()
        writer._env.copy(str(clone))
        shutil.copy(path / INSTANCE_FILE, clone / INSTANCE_FILE)
        for mode in ("open", "open"):  # twice: a refused clone changes nothing for the next try
            done = subprocess.run(
                in_namespace(clone, path, nats_server.url, store, mode),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.stdout.startswith("refused NotWriterError"), (done.stdout, done.stderr)
            assert "take_over" in done.stdout
        seq = await writer.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
        assert seq == first + 1, "the live writer was neither fenced nor deposed"
        assert writer.replication.lease.lost is None  # type: ignore[union-attr]
    finally:
        await writer.close()


def kill_a_holder(path: Path, url: str, store: str, ttl: int = 2) -> None:
    """A writer process that takes the lease (for ``ttl`` seconds), commits, and is SIGKILLed
    holding it."""

    child = subprocess.Popen(
        [sys.executable, "-c", OPEN, str(path), url, store, "hold", str(ttl)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith("opened")
        assert child.stdout.readline().startswith("committed")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


async def test_the_same_writer_restarted_reclaims_its_lease_without_take_over(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    path = tmp_path / "store"
    first = await LmdbStorage.open(
        path, durability="replicated", nats=nats_server.url, stream="CLONE", lease_ttl=30
    )
    store = first.store_id
    assert store is not None
    await first.close()  # releases the lease; now a holder that dies holding it:
    kill_a_holder(path, nats_server.url, store)
    # the lease lives 30 s more on the server; the restarted writer of this instance sees
    # nobody renew it and takes it at once
    again = await LmdbStorage.open(
        path, durability="replicated", nats=nats_server.url, stream="CLONE", lease_ttl=30
    )
    try:
        assert await again.conversation(777, CTX) is not None
        await again.commit([{"type": "conversation", "value": {"id": 778}}], CTX)
    finally:
        await again.close()


async def test_another_instance_waits_for_a_dead_holders_lease_to_expire(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A copy without the instance id (a store restored elsewhere at the same path) is not the
    holder: without ``take_over`` it is refused even while nobody renews the lease."""

    path = tmp_path / "store"
    first = await LmdbStorage.open(
        path, durability="replicated", nats=nats_server.url, stream="CLONE", lease_ttl=30
    )
    store = first.store_id
    assert store is not None
    await first.close()
    # a lease that outlives anything a loaded machine can delay: the copy's open below must
    # meet it live (a 2 s lease could lapse while the copy's interpreter starts, and it opened)
    kill_a_holder(path, nats_server.url, store, ttl=600)
    (path / INSTANCE_FILE).unlink()
    done = subprocess.run(
        [sys.executable, "-c", OPEN, str(path), nats_server.url, store, "open"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("refused NotWriterError"), (done.stdout, done.stderr)
