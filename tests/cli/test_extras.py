"""A refusal that needs an optional extra says how to install it in one form everywhere (from a
checkout, or from the wheel with one placeholder for its version): the form lives in one place,
``errors.install_hint``, and every message that names an extra uses it."""

from __future__ import annotations

from pathlib import Path

from pi_durable_lmdb.cli.common import serve_missing
from pi_durable_lmdb.errors import install_hint
from pi_durable_lmdb.tlog.note import MISSING

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_install_form_is_written_in_one_place() -> None:
    written = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if "pip install" in path.read_text()
    )
    assert written == ["errors.py"]


def test_each_missing_extra_message_uses_it() -> None:
    assert install_hint("web") in str(serve_missing("aiohttp"))
    assert MISSING.endswith(install_hint("audit"))
    source = (SRC / "log" / "stream" / "jetstream.py").read_text()
    assert "the [nats] extra: {install_hint('nats')}" in source  # raised only without nats-py
    hint = install_hint("nats")
    assert hint == (
        "from a checkout, pip install '/path/to/pi-durable-lmdb[nats]'; "
        "from a wheel, pip install 'pi_durable_lmdb-VERSION-py3-none-any.whl[nats]'"
    )
