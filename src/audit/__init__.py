"""The operator functions the command line and the web view run on a store, above the
``Storage`` contract (``storage``) and below both (``cli``, ``web``): ``tail``, ``stats``,
``verify``, ``export``, ``show``, ``listing`` (records of a kind filtered by fields), import
(``migrate``, ``pisource``), ``restore``, ``search``, ``transparency`` and ``witness``
(checkpoints, proofs), ``proofs`` (a proof checked offline), ``access``, and the shared parsing and
wording of their input and output (``numbers``, ``jsonlines``, ``words``).

The most used are named here: ``from pi_durable_lmdb.audit import Tail, TailFilter, verify``.
"""

from __future__ import annotations

from ..storage.backup import backup
from .export import export_lines, seq_at, seq_range
from .jsonlines import to_json
from .show import SHOW_KINDS, show
from .stats import format_stats, lease_of, require_store, stats, stored_projections
from .tail import (
    DocumentLookup,
    StreamTail,
    Tail,
    TailFilter,
    commit_to_builtins,
    conversation_of,
    open_stream,
    stream_subject,
    summarize,
)
from .verify import Difference, VerifyReport, check, describe_key, verify
from .words import format_bytes, plural

__all__ = [
    "SHOW_KINDS",
    "Difference",
    "DocumentLookup",
    "StreamTail",
    "Tail",
    "TailFilter",
    "VerifyReport",
    "backup",
    "check",
    "commit_to_builtins",
    "conversation_of",
    "describe_key",
    "export_lines",
    "format_bytes",
    "format_stats",
    "lease_of",
    "open_stream",
    "plural",
    "require_store",
    "seq_at",
    "seq_range",
    "show",
    "stats",
    "stored_projections",
    "stream_subject",
    "summarize",
    "to_json",
    "verify",
]
