"""Every JetStream refusal of an append the link can meet maps to the error that says what to do
(docs/distributed.md lists the codes). Clustered JetStream answers a racing
conditional append with 10164 ("wrong last sequence", no number): it used to surface as a bare
``ReplicationError`` and fail a forced take-over about one time in five, where it means exactly
what 10071 means: the subject moved, so the writer is deposed and its racing commits get
``NotWriterError``."""

from __future__ import annotations

import pytest
from pi_durable_lmdb.errors import (
    NatsUnavailableError,
    ReplicationError,
    StreamMissingError,
    StreamMovedError,
)
from pi_durable_lmdb.log.stream.jetstream import refusal_error

SUBJECT = "S.store.log"


@pytest.mark.parametrize(
    "refusal,kind,found",
    [
        (
            {"code": 400, "err_code": 10071, "description": "wrong last sequence: 17"},
            StreamMovedError,
            17,
        ),
        (
            {"code": 400, "err_code": 10164, "description": "wrong last sequence"},
            StreamMovedError,
            None,
        ),
        (
            {
                "code": 400,
                "err_code": 10201,
                "description": "batch contains a duplicate message id",
            },
            StreamMovedError,
            None,
        ),
    ],
    ids=["10071", "10164", "10201"],
)
def test_a_moved_subject_is_named_as_moved(
    refusal: dict[str, object], kind: type, found: int | None
) -> None:
    error = refusal_error(SUBJECT, 12, refusal)
    assert type(error) is kind
    assert isinstance(error, StreamMovedError) and error.expected == 12 and error.found == found


@pytest.mark.parametrize(
    "refusal,kind",
    [
        (
            {
                "code": 503,
                "err_code": 10008,
                "description": "JetStream system temporarily unavailable",
            },
            NatsUnavailableError,
        ),
        (
            {"code": 503, "err_code": 10023, "description": "insufficient resources"},
            NatsUnavailableError,
        ),
        (
            {
                "code": 500,
                "err_code": 10047,
                "description": "insufficient storage resources available",
            },
            NatsUnavailableError,
        ),
        (
            {
                "code": 500,
                "err_code": 10028,
                "description": "insufficient memory resources available",
            },
            NatsUnavailableError,
        ),
        ({"code": 503, "description": "no quorum"}, NatsUnavailableError),
        ({"code": 404, "err_code": 10059, "description": "stream not found"}, StreamMissingError),
        (
            {"code": 400, "err_code": 10060, "description": "expected stream does not match"},
            StreamMissingError,
        ),
        (
            {"code": 400, "err_code": 10054, "description": "message size exceeds maximum allowed"},
            ReplicationError,
        ),
        ({"code": 400, "err_code": 19999, "description": "something new"}, ReplicationError),
    ],
    ids=lambda value: (
        str(value.get("err_code", value.get("code"))) if isinstance(value, dict) else value.__name__
    ),
)
def test_every_other_refusal_names_its_code_and_its_kind(
    refusal: dict[str, object], kind: type
) -> None:
    error = refusal_error(SUBJECT, 3, refusal)
    assert type(error) is kind
    assert SUBJECT in str(error) and str(refusal["description"]) in str(error)
    if "err_code" in refusal:
        assert f"JetStream error {refusal['err_code']}" in str(error)
    assert not isinstance(error, StreamMovedError)
