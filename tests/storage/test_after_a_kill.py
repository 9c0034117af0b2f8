"""Every command that writes or replaces store files, on a store left by a killed writer of
either durability, on the same boot or after a reboot: it completes and nothing acknowledged is
lost, or it refuses with a clear error and leaves the store as it was (docs/reliability.md,
"Markers" and section 9).

A matrix: durability (power, process) x kill point (mid-commit, after the last commit, during a
checkpoint, which for ``process`` is the close's final sync) x command (compact, backup,
restore onto the store, import into it, rebuild, a writer open of the other durability) x reboot
or not. Each killed store is made once per durability and kill point and copied per case. A
reboot is the boot id in the store's markers changed and, after a power writer was killed, LMDB's
own meta pages zeroed (what a power cut may leave: only the journal's checkpoint holds them).
After the command, the store is checked as the next boot finds it: any power marker is given
another boot again, and a power writer must find every acknowledged commit.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, StoreDamagedError
from pi_durable_lmdb.cli import main
from pi_durable_lmdb.errors import DurableLmdbError
from pi_durable_lmdb.log.storedir import POWER_FILE, UNSYNCED_FILE
from pi_durable_lmdb.log.storeid import new_store_id

from tools.harness.iofaults.check import reboot

ROOT = Path(__file__).resolve().parent.parent.parent

KILLED_WRITER = textwrap.dedent("""
    import asyncio, os, random, string, sys
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb import LmdbStorage
    from pi_durable_lmdb.log.journal import JournalOptions

    store, durability, point = sys.argv[1], sys.argv[2], sys.argv[3]
    COMMITS = 24
    real_fdatasync, real_pwrite, real_unlink = os.fdatasync, os.pwrite, os.unlink
    state = {"armed": False}

    def named(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def fdatasync(fd):  # power, mid-commit: the last frame flushed, LMDB never commits it
        real_fdatasync(fd)
        if point == "mid-commit" and state["armed"] and named(fd).endswith(".seg"):
            os._exit(9)

    def pwrite(fd, data, offset):  # power, checkpoint: a checkpoint record cut halfway
        if point == "checkpoint" and state["armed"] and "checkpoint." in named(fd):
            real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
            os._exit(9)
        return real_pwrite(fd, data, offset)

    def unlink(path, *args, **kwargs):  # process, checkpoint: synced at close, killed before the marker goes
        if point == "checkpoint" and durability == "process" and str(path).endswith("process.unsynced"):
            os._exit(9)
        return real_unlink(path, *args, **kwargs)

    os.fdatasync, os.pwrite, os.unlink = fdatasync, pwrite, unlink

    async def main():
        options = {"journal": JournalOptions(segment_size=2 * 4096, checkpoint_commits=6, background=False)} if durability == "power" else {}
        storage = await LmdbStorage.open(store, durability=durability, map_size=256 * 1024, **options)
        rng = random.Random(7)
        for n in range(COMMITS + 1):
            conversation = await storage.mint_id()
            pad = "".join(rng.choices(string.ascii_letters, k=900))
            if n == COMMITS:
                state["armed"] = True
            if n == COMMITS and point == "mid-commit" and durability == "process":
                def work(txn):  # killed inside a write transaction
                    txn.put(b"x", b"y")
                    os._exit(9)
                storage.log.env.write(work)
            if n == COMMITS and point != "mid-commit":
                break
            seq = await storage.commit([{"type": "conversation", "value": {"id": conversation, "pad": pad}}], CTX)
            print(seq, conversation, flush=True)
        if point == "checkpoint" and durability == "process":
            await storage.close()
        if point == "checkpoint" and durability == "power":
            for n in range(COMMITS):
                await storage.commit([{"type": "conversation", "value": {"id": await storage.mint_id()}}], CTX)
        os._exit(9)

    asyncio.run(main())
""")

DURABILITIES = ("power", "process")
POINTS = ("mid-commit", "after-commit", "checkpoint")
COMMANDS = ("compact", "backup", "restore-onto", "import-into", "rebuild", "other-durability")


@pytest.fixture(scope="module")
def killed(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], tuple[Path, list[tuple[int, int]]]]:
    """Each durability and kill point: a store its writer left, and what it acknowledged."""

    made = {}
    for durability in DURABILITIES:
        for point in POINTS:
            path = tmp_path_factory.mktemp("killed") / f"{durability}-{point}"
            done = subprocess.run(
                [sys.executable, "-c", KILLED_WRITER, str(path), durability, point],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            assert done.returncode == 9, (durability, point, done.stderr)
            acked = [
                (int(seq), int(conversation))
                for seq, conversation in (line.split() for line in done.stdout.split("\n") if line)
            ]
            assert len(acked) == 24, (durability, point, done.stderr)
            marker = POWER_FILE if durability == "power" else UNSYNCED_FILE
            assert (path / marker).exists(), f"the killed {durability} writer left no {marker}"
            made[(durability, point)] = (path, acked)
    return made


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


async def holds(path: Path, acked: list[tuple[int, int]], **options: Any) -> None:
    storage = await LmdbStorage.open(path, **options)
    try:
        assert storage.log.head() >= acked[-1][0], "acknowledged commits lost"
        for seq, conversation in acked:
            assert await storage.conversation(conversation, CTX) is not None, (
                f"acknowledged commit {seq} lost"
            )
    finally:
        await storage.close()


def run_command(
    command: str, durability: str, path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    if command == "compact":
        return run_cli("compact", str(path), capsys=capsys)
    if command == "backup":
        return run_cli("backup", str(path), str(tmp_path / "backup"), capsys=capsys)
    if command == "restore-onto":
        return run_cli(
            "restore",
            "--nats",
            "nats://127.0.0.1:9",
            "--stream",
            "S",
            "--store",
            new_store_id(),
            str(path),
            capsys=capsys,
        )
    if command == "import-into":
        export = tmp_path / "export.jsonl"
        export.write_text(
            '{"seq": 1, "committedAt": 0, "writes": [{"type": "conversation", "value": {"id": 5}}]}\n'
        )
        return run_cli("import", str(export), str(path), capsys=capsys)
    if command == "rebuild":
        return run_cli("rebuild", str(path), capsys=capsys)
    other = "process" if durability == "power" else "power"

    async def open_other() -> None:
        storage = await LmdbStorage.open(path, durability=other)
        try:
            await storage.commit(
                [{"type": "conversation", "value": {"id": await storage.mint_id()}}], CTX
            )
        finally:
            await storage.close()

    try:
        asyncio.run(open_other())
    except DurableLmdbError as error:  # the refusal is checked by the caller
        return 2, f"{type(error).__name__}: {error}"
    return 0, ""


REFUSALS = {
    "restore-onto": "not empty",
    "import-into": "not empty",
}


@pytest.mark.slow
@pytest.mark.parametrize("rebooted", [False, True], ids=["same-boot", "rebooted"])
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_command_on_a_store_a_killed_writer_left_completes_or_refuses_and_loses_nothing(
    killed: dict[tuple[str, str], tuple[Path, list[tuple[int, int]]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    durability: str,
    point: str,
    command: str,
    rebooted: bool,
) -> None:
    source, acked = killed[(durability, point)]
    path = tmp_path / "store"
    shutil.copytree(source, path, ignore=shutil.ignore_patterns("lock.mdb", "writer.lock"))
    if rebooted:
        reboot(path)
    code, err = run_command(command, durability, path, tmp_path, capsys)
    crashed_process = durability == "process" and rebooted
    if command in REFUSALS:
        assert code == 2 and REFUSALS[command] in err, err
    elif crashed_process:  # unsynced pages after an OS crash: every command refuses, naming why
        assert code == 2 and "when the machine stopped" in err, err
        assert (path / UNSYNCED_FILE).exists()
        with pytest.raises(StoreDamagedError):
            asyncio.run(holds(path, acked))
        return
    elif (
        command == "other-durability" and durability == "power"
    ):  # only a power writer replays its journal
        assert code == 2 and "JournalReplayPending" in err and "durability='power'" in err, err
    elif (
        command == "backup" and durability == "power" and rebooted
    ):  # a read-only copy cannot replay
        assert code == 2 and "durability='power'" in err, err
    else:
        assert code == 0, err
    if command == "backup" and code == 0:
        asyncio.run(holds(tmp_path / "backup", acked, durability="process"))
    if crashed_process:
        return
    if durability == "process" and command in ("compact", "rebuild", "other-durability"):
        assert not (path / UNSYNCED_FILE).exists(), (
            "the whole file is durable: the marker is obsolete"
        )
    reboot(path, process=False)  # the next boot, as a power cut right after the command leaves it
    asyncio.run(holds(path, acked))
    assert not (path / POWER_FILE).exists() and not (path / UNSYNCED_FILE).exists(), (
        "a closed writer left a marker"
    )


def _killed(tmp_path: Path, durability: str) -> tuple[Path, list[tuple[int, int]]]:
    path = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(path), durability, "after-commit"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 9, done.stderr
    return path, [
        (int(seq), int(conversation))
        for seq, conversation in (line.split() for line in done.stdout.split("\n") if line)
    ]


def test_compact_after_a_killed_power_writer_then_a_reboot_keeps_every_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compact`` used to check only the process marker: it swapped the file in and left the
    power marker, whose checkpoint held the old file's meta pages; after a reboot the writer's
    open wrote them over the compacted file (TruncatedStoreError, every commit unreachable)."""

    path, acked = _killed(tmp_path, "power")
    assert run_cli("compact", str(path), capsys=capsys)[0] == 0
    assert not (path / POWER_FILE).exists(), (
        "the synced file needs no journal: the marker is obsolete"
    )
    reboot(path)
    asyncio.run(holds(path, acked))


def test_a_power_writer_removes_the_marker_of_a_process_writer_killed_before_it(
    tmp_path: Path,
) -> None:
    """A power writer that synced the whole file used to leave a killed process writer's marker:
    after a reboot every open refused the healthy store as damaged."""

    path, acked = _killed(tmp_path, "process")
    asyncio.run(holds(path, acked))
    assert not (path / UNSYNCED_FILE).exists()
    reboot(path)
    asyncio.run(holds(path, acked))
