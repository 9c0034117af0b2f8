"""Every number, duration and point the command line reads goes through ``audit.numbers``: ASCII
digits only, a stated range, a text too long to be a number refused before ``int()`` sees it, the
option named in the refusal, exit 2 and never a traceback."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable_lmdb import cli as cli_module
from pi_durable_lmdb.audit import numbers
from pi_durable_lmdb.audit.numbers import INTERVAL, SEQUENCE, Whole, point, seconds, whole
from pi_durable_lmdb.errors import NumberError

from tests.support.cli_call import call

HUGE = "9" * 5000
"""Beyond Python's 4,300-digit ``int()`` limit."""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    from pi_durable_lmdb.cli.demo import run_workload

    path = tmp_path_factory.mktemp("numbers") / "store"
    asyncio.run(run_workload(str(path)))
    return path


def _actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {dest}", each) for dest, each in _actions(sub)]
        else:
            found.append((action.dest, action))
    return found


def test_every_typed_argument_of_every_command_is_parsed_by_the_numbers_module() -> None:
    typed = [
        (name, action.type)
        for name, action in _actions(cli_module._parser())
        if action.type is not None and action.metavar != "KIND"  # kinds: tests/cli/test_surface.py
    ]
    assert len(typed) >= 15, typed
    for name, parse in typed:
        assert getattr(parse, "__module__", None) == numbers.__name__, (
            f"{name} is parsed by {parse!r}"
        )


# (arguments, the option the refusal names, words it holds); PATH: a store
REFUSED = [
    (["stats", "PATH", "--watch", "--every", "inf"], "--every", "is not an interval"),
    (["stats", "PATH", "--watch", "--every", "nan"], "--every", "is not an interval"),
    (["stats", "PATH", "--watch", "--every", "0"], "--every", "from 0.1 to 86400"),
    (["stats", "PATH", "--watch", "--every", "1e-300"], "--every", "from 0.1 to 86400"),
    (["stats", "PATH", "--watch", "--every", "-1"], "--every", "from 0.1 to 86400"),
    (["stats", "PATH", "--watch", "--every", "١"], "--every", "is not an interval"),
    (["stats", "PATH", "--watch", "--every", HUGE], "--every", "characters"),
    (
        ["promote", "PATH", "--nats", "nats://127.0.0.1:1", "--stream", "S", "--lease-ttl", "0"],
        "--lease-ttl",
        "from 1 to 3600",
    ),
    (
        ["promote", "PATH", "--nats", "nats://127.0.0.1:1", "--stream", "S", "--lease-ttl", "-5"],
        "--lease-ttl",
        "from 1 to 3600",
    ),
    (
        ["promote", "PATH", "--nats", "nats://127.0.0.1:1", "--stream", "S", "--lease-ttl", "3601"],
        "--lease-ttl",
        "from 1 to 3600",
    ),
    (["tail", "PATH", "--conversation", "-5"], "--conversation", "is not a conversation id"),
    (["tail", "PATH", "--conversation", "٣"], "--conversation", "ASCII digits"),
    (["tail", "PATH", "--from", "²"], "--from", "ASCII digits"),
    (["tail", "PATH", "--from", HUGE], "--from", "(5,000 characters)"),
    (["tail", "PATH", "--limit", HUGE], "--limit", "characters"),
    (["tail", "PATH", "--limit", "1.5"], "--limit", "is not a count"),
    (["show", "PATH", "task", "1", "--as-of", "٣"], "--as-of", "ASCII digits"),
    (["show", "PATH", "task", "1", "--as-of", "²"], "--as-of", "ASCII digits"),
    (["show", "PATH", "task", "1", "--as-of", "-3"], "--as-of", "is not a log sequence"),
    (["show", "PATH", "task", "1", "--as-of", HUGE], "--as-of", "characters"),
    (["show", "PATH", "task", "1", "--as-of", "٢٠٢٦-١٢-٠١"], "--as-of", "neither a log sequence"),
    (["show", "PATH", "task", "٣"], "ID", "ASCII digits"),
    (["show", "PATH", "task", HUGE], "ID", "characters"),
    (["export", "PATH", "--to", "٣"], "--to", "ASCII digits"),
    (["export", "PATH", "--since", "٢٠٢٦-١٢-٠١"], "--since", "is not a timestamp"),
    (["verify", "PATH", "--max-differences", "0"], "--max-differences", "1 or more"),
    (["verify", "PATH", "--max-differences", HUGE], "--max-differences", "characters"),
    (
        [
            "restore",
            "--nats",
            "nats://127.0.0.1:1",
            "--stream",
            "S",
            "--store",
            "x",
            "NEW",
            "--to",
            "0",
        ],
        "--to",
        "1 or more",
    ),
    (
        [
            "replica",
            "NEW",
            "--nats",
            "nats://127.0.0.1:1",
            "--stream",
            "S",
            "--store",
            "x",
            "--interval",
            "inf",
        ],
        "--interval",
        "is not an interval",
    ),
    (
        [
            "replica",
            "NEW",
            "--nats",
            "nats://127.0.0.1:1",
            "--stream",
            "S",
            "--store",
            "x",
            "--interval",
            "0",
        ],
        "--interval",
        "from 0.1",
    ),
    (["serve", "PATH", "--port", "65536"], "--port", "from 0 to 65535"),
    (["serve", "PATH", "--port", "٨٠"], "--port", "ASCII digits"),
    (["serve", "PATH", "--max-lag", "-1"], "--max-lag", "0 or more"),
]


@pytest.mark.parametrize(
    "args, option, words", REFUSED, ids=[" ".join(a)[:70] for a, _, _ in REFUSED]
)
def test_a_bad_number_is_refused_naming_its_option_with_exit_2(
    store: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    option: str,
    words: str,
) -> None:
    before = sorted(os.listdir(store)), os.stat(store / "data.mdb").st_mtime_ns
    code, out, err = call(
        capsys, *[{"PATH": str(store), "NEW": str(tmp_path / "new")}.get(arg, arg) for arg in args]
    )
    assert code == 2 and out == "", (code, err)
    assert option in err.split("error:", 1)[-1], err
    assert words in err, err
    assert "Traceback" not in err
    if option not in ("--from", "--as-of", "--to"):
        assert "log sequence" not in err, "the refusal names what the option is"
    assert len(err) < 2000, "a huge number is not echoed whole"
    assert (sorted(os.listdir(store)), os.stat(store / "data.mdb").st_mtime_ns) == before
    assert os.listdir(tmp_path) == []


def test_the_lease_ttl_refusal_is_the_same_for_0_and_minus_5(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["promote", str(store), "--nats", "nats://127.0.0.1:1", "--stream", "S", "--lease-ttl"]
    refusals = [
        call(capsys, *base, ttl)[2].splitlines()[-1].replace(repr(ttl), "X") for ttl in ("0", "-5")
    ]
    assert refusals[0] == refusals[1], refusals


def test_tail_conversation_names_a_conversation_id_not_a_log_sequence(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = call(capsys, "tail", store, "--conversation", "-5")
    assert (
        code == 2
        and "--conversation" in err
        and "conversation id" in err
        and "log sequence" not in err
    ), err


def test_good_numbers_still_work(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = call(capsys, "tail", store, "--conversation", " 1 ", "--limit", "+2")
    assert code == 0 and len(out.splitlines()) == 2, err
    code, out, err = call(capsys, "show", store, "conversation", "1", "--as-of", "5", "--json")
    assert code == 0 and '"id"' in out, err


# ── the parsers themselves ────────────────────────────────────────────────────


@given(st.integers(min_value=1, max_value=numbers.INT64_MAX))
def test_a_whole_number_in_ascii_digits_reads_back(value: int) -> None:
    assert whole(str(value), SEQUENCE) == value
    assert point(str(value)) == ("seq", value)


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=60))
def test_any_text_is_a_number_in_range_or_a_number_error(text: str) -> None:
    rule = Whole("a thing", 0, 1000)
    try:
        value = whole(text, rule)
    except NumberError as error:
        assert "is not a thing" in str(error)
    else:
        assert 0 <= value <= 1000 and text.strip().lstrip("+-").isascii()
    try:
        found = seconds(text, INTERVAL)
    except NumberError:
        pass
    else:
        assert 0.1 <= found <= 86400 and text.strip().isascii()
    try:
        point(text)
    except NumberError:
        pass


@pytest.mark.parametrize(
    "text", ["٣", "²", "³", "①", "𝟑", "٢٠", "1_000", "0x10", " ", "", "-", "+", "1e3", "inf"]
)
def test_what_int_or_isdigit_would_take_is_refused(text: str) -> None:
    with pytest.raises(NumberError):
        whole(text, SEQUENCE)


def test_an_over_long_number_is_refused_before_int_reads_it() -> None:
    with pytest.raises(NumberError, match="characters"):
        whole("1" * 100_000, SEQUENCE)
    with pytest.raises(NumberError, match="characters"):
        seconds("1" * 100_000, INTERVAL)
    with pytest.raises(NumberError):
        point("1" * 100_000)
