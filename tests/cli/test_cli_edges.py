"""The command line's edges an auditor meets: ``tail --to``, ``--from`` past the head said on
stderr, ``show --pretty``, what ``stats`` counts as free pages (in words and in its JSON key), and
a NATS silence named by its cause."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

DURABLE_LOG = [sys.executable, "-m", "pi_durable_lmdb.cli"]


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DURABLE_LOG, *map(str, args)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("edges") / "store"

    async def build() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for n in range(6):
                await storage.commit(
                    [
                        {
                            "type": "entry",
                            "value": {
                                "id": 10 + n,
                                "conversationId": 1,
                                "kind": "message",
                                "model": [{"role": "user", "content": f"line {n} é"}],
                            },
                        }
                    ],
                    CTX,
                )
        finally:
            await storage.close()

    asyncio.run(build())
    return path


def _seqs(stdout: str) -> list[int]:
    return [json.loads(line)["seq"] for line in stdout.splitlines()]


def test_tail_to_ends_the_range(store: Path) -> None:
    done = run("tail", store, "--from", 2, "--to", 4, "--json")
    assert done.returncode == 0 and _seqs(done.stdout) == [2, 3, 4]
    assert _seqs(run("tail", store, "--to", 3, "--json").stdout) == [1, 2, 3]
    assert "entry 12 in 1" in run("tail", store, "--from", 4, "--to", 4).stdout
    refused = run("tail", store, "--from", 5, "--to", 4)
    assert refused.returncode == 2 and "empty range" in refused.stderr
    refused = run("tail", store, "--to", 4, "--follow")
    assert refused.returncode == 2 and "--follow never ends" in refused.stderr


def test_from_past_the_head_is_said_on_stderr(store: Path) -> None:
    for command in (["tail", store, "--from", 99], ["export", store, "--from", 99]):
        done = run(*command)
        assert done.returncode == 0 and done.stdout == ""
        assert "--from 99 is past the log's head (7): nothing to print" in done.stderr, command
    assert run("tail", store, "--from", 7).stderr == ""


def test_show_pretty_indents_the_same_json(store: Path) -> None:
    flat = run("show", store, "entry", 12, "--json")
    pretty = run("show", store, "entry", 12, "--pretty")
    assert pretty.returncode == 0 and json.loads(pretty.stdout) == json.loads(flat.stdout)
    assert (
        pretty.stdout.count("\n") > 5 and '\n  "entry": {' in pretty.stdout and "é" in pretty.stdout
    )


def test_free_pages_say_what_they_count_with_the_json_keys_name(store: Path) -> None:
    text = run("stats", store).stdout
    info = json.loads(run("stats", store, "--json").stdout)["footprint"]
    line = next(line for line in text.splitlines() if line.startswith("free pages"))
    assert (
        f"{info['freePages']:,} of the file's {info['pagesUpToLastUsed']:,} pages up to its last used one"
        in line
    )
    assert "(freePages of pagesUpToLastUsed" in line
    why = text.splitlines()[text.splitlines().index(line) + 1]
    assert "normal: LMDB never overwrites a page" in why, "a large free share is said to be fine"
    assert info["usedPages"] == info["pagesUpToLastUsed"]  # the older key, kept for its readers


def test_a_nats_silence_is_named_by_its_cause() -> None:
    import nats.errors
    from pi_durable_lmdb.log.stream.jetstream import cause_of

    assert "JetStream is not enabled" in cause_of(nats.errors.NoRespondersError(), 5.0)
    timed_out = cause_of(nats.errors.TimeoutError(), 5.0)
    assert "no reply within 5 s" in timed_out and "quorum" in timed_out
    assert "nothing listening" in cause_of(TimeoutError(), 5.0, connecting=True)
    assert cause_of(OSError("Connection refused"), 5.0) == "OSError: Connection refused"
