"""A reader in another process never sees a long document in a state no commit left it in.

The writer (this process) commits agent turns to a document many chunks long (appends of up to
two chunks with the turn count, now and then a trim from its front, a splice of its log, a base
that rebases it); pi-durable's ``MemoryStorage`` gets the same batches and says what each commit
left (``value_digest`` of its value and version, by sequence). A reader process
(``tests/support/long_document_reader_child.py``) opens the store read-only before the first
turn and reads the document again and again, current and at past points, reopening now and
then: every current read must show the document as some commit between the log heads it saw
just before and just after the read, every past read exactly as that commit left it, and its
last read, after the writer's last commit, the final state. Bounded in commits and reads; no
claim about how many reads fall between two commits.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.projections.tables import CHUNK
from pi_durable_lmdb.storage import LmdbStorage

from ..support.long_document_reader_child import value_digest
from ..support.long_documents import append_ops, long_ops, long_value
from ..support.polling import until_async

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(ROOT / "tests" / "support" / "long_document_reader_child.py")
TURNS = 160
DOCUMENT = 7


def _turn(rng: random.Random, number: int, value: Any, version: int) -> dict[str, Any]:
    """Mostly an appended line and the turn count; every so often another op, or a base."""

    change: dict[str, Any] = {"type": "document.change", "id": DOCUMENT}
    if number % 40 == 39:
        rebased = {**value, "turns": number, "text": value["text"][CHUNK // 2 :]}
        change["content"] = {"kind": "base", "version": version, "value": rebased}
        return change
    if number % 9 == 8:
        ops = long_ops(rng, value, rng.choice(["trim", "splice", "move", "set", "several"]))
    else:
        ops = append_ops(rng, value, rng.choice([40, 300, 1500, 4000, CHUNK + 7]))
    change["content"] = {"kind": "delta", "version": version, "ops": ops}
    return change


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["process", "power"])
def test_a_reader_in_another_process_sees_only_committed_states(
    tmp_path: Path, durability: str
) -> None:
    path = tmp_path / "store"
    stop = tmp_path / "stop"
    out = tmp_path / "reader.jsonl"
    committed: dict[int, str] = {}  # sequence -> digest of the document it left

    async def setup() -> tuple[Any, Any]:
        storage = await LmdbStorage.open(path, durability=durability)
        ref = MemoryStorage()
        rng = random.Random(5)
        value = long_value(rng, 3 * CHUNK)
        record = {
            "id": DOCUMENT,
            "kind": "notes",
            "scope": {"kind": "conversation", "conversationId": 1},
            "history": "rewindable",
            "fork": "asOf",
        }
        for writes in (
            [{"type": "conversation", "value": {"id": 1}}],
            [
                {
                    "type": "document.create",
                    "record": record,
                    "content": {"kind": "base", "version": 1, "value": value},
                }
            ],
        ):
            await commit(storage, ref, writes)
        return storage, ref

    async def commit(storage: Any, ref: Any, writes: list[dict[str, Any]]) -> Any:
        seq = await storage.commit(writes, CTX)
        assert await ref.commit(writes, CTX) == seq
        stored = await ref.document(DOCUMENT, "current", CTX)
        committed[seq] = value_digest(stored)
        return stored

    async def turns(storage: Any, ref: Any) -> int:
        rng = random.Random(11)
        stored = await ref.document(DOCUMENT, "current", CTX)
        for number in range(TURNS):
            change = _turn(rng, number, stored["value"], stored["version"])
            stored = await commit(storage, ref, [change])
            await asyncio.sleep(0)
        size = len(json.dumps(stored["value"]))
        assert size > 40 * CHUNK, size  # the document spans tens of chunks
        return storage.log.head()

    async def body() -> int:
        storage, ref = await setup()
        reader = None
        try:
            with open(out, "w", encoding="utf-8") as file:
                reader = subprocess.Popen(
                    [sys.executable, CHILD, str(path), str(DOCUMENT), str(stop)],
                    stdout=file,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
            await until_async(
                lambda: out.read_text().startswith("ready") or reader.poll() is not None,
                timeout=60,
                what="reader ready",
            )
            last = await turns(storage, ref)
            stop.write_text(str(last))
            _, stderr = await asyncio.to_thread(reader.communicate, timeout=300)
            assert reader.returncode == 0, stderr[-3000:]
            return last
        finally:
            if reader is not None and reader.poll() is None:
                reader.kill()
                reader.wait()
            await storage.close()

    last = asyncio.run(body())
    lines = out.read_text().splitlines()
    assert lines[0] == "ready" and lines[-1] == "done", lines[-3:]
    reads = [json.loads(line) for line in lines[1:-1]]
    seen: set[str] = set()
    for read in reads:
        if read["at"] == "current":
            # the state of some commit from `before` to `after`: the document changes at each
            allowed = {committed[seq] for seq in range(read["before"], read["after"] + 1)}
            assert read["digest"] in allowed, f"{read}: no commit left the document so"
        else:
            assert read["digest"] == committed[read["at"]], f"{read}: not as that commit left it"
        seen.add(read["digest"])
    final = reads[-1]
    assert final.get("final") and final["digest"] == committed[last], final
    assert len(seen) >= 2  # at least the first state and the last
