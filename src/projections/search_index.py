"""A word index of a store, kept beside it as one more projection of the log: entries by the words
of their messages and data, documents by the words of their values, tasks by the words of their
kind and their state.

It lives in its own LMDB environment, ``search.index`` inside the store directory, so it costs a
store nothing until someone asks for it (the first ``durable-log search``) and can be deleted at any
time: the next catch-up folds the whole log again. A catch-up reads the store read-only (it never
blocks the store's writer) and folds every record past the index's checkpoint, a chunk per write
transaction, the checkpoint written with the chunk's postings.

A posting key is ``word NUL kind (8-byte max - seq) (8-byte id)``: one word's postings of one kind
are contiguous and newest first, so a query walks them from the point it is asked at (``as_of``)
backwards and stops when it has a page. Entries are written once: their postings are exact.
A document posts the words a version added (not those it kept), a task the words of its kind when
first written and of its state when that changes: both are candidates that a query checks against
the record as it stands at the point asked (a task through the words the index keeps for it at
each change). A current-only document keeps no past values in the store, so the index keeps the
last value it folded of each (the next delta applies to it, and its words tell which are new).
Beside the postings, each conversation's newest activity and entry count, so a list
can show conversations by when they last moved.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import struct
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, assert_never

import lmdb
import msgspec

from ..errors import SearchIndexError
from ..log import Commit, codec
from ..log.records import (
    BaseContent,
    ConversationWrite,
    DocumentChangeWrite,
    DocumentCopyWrite,
    DocumentCreateWrite,
    DocumentRetireWrite,
    EntryWrite,
    SubmissionWrite,
    TaskWrite,
)
from .delta import apply_ops
from .readmodel import is_current_only

INDEX_DIR: Final = "search.index"
"""The index's directory inside the store directory."""
FORMAT: Final = 6
"""Bump when postings change shape: an index of another format is dropped and folded again."""
UNICODE: Final = unicodedata.unidata_version
"""The Unicode database words are split and lower-cased by (``re``'s ``\\w``, ``str.lower``): the
interpreter's own (14.0 on Python 3.11, 15.0 on 3.12, 15.1 on 3.13), so another Python may split
the same text into other words. The header records it; an index of another is folded again."""
MAP_SIZE: Final = 1 << 36
"""Address space reserved for the index (the file grows only as postings are written)."""
CHUNK: Final = 16384
"""Records folded per write transaction."""
MAX_WORD: Final = 64
"""Characters of a word kept (a longer word is indexed and looked up by its first 64)."""

ENTRY: Final = b"e"
DOCUMENT: Final = b"d"
TASK: Final = b"t"
KIND_NAMES: Final = {ENTRY: "entry", DOCUMENT: "document", TASK: "task"}

_POSTINGS: Final = b"postings"
_TASKS: Final = b"tasks"
"""``(task id, seq)`` -> the words of the task's kind, NUL, the words of the state commit ``seq``
gave it (a row per change of state words): a task's words at any point are one seek away."""
_VALUES: Final = b"values"
"""Current-only document id -> the last value the index folded of it (codec-encoded): the store
keeps no earlier value to read back, so a later delta is applied to this one."""
_META: Final = b"meta"
_ACTIVITY: Final = b"activity"
"""Conversation id -> its last commit's sequence and time, and how many entries of its own it has."""
_RECENT: Final = b"recent"
"""``(max - last sequence, conversation id)``: conversations by their newest activity, newest first."""
_HEADER_KEY: Final = b"header"
_MAX: Final = 2**64 - 1
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_ACTIVE = struct.Struct(">QQQ")
_WORDS: Final = re.compile(r"\w+")
_SKIPPED_KEYS: Final = frozenset({"role", "type"})
"""Keys of a message whose values are labels, not what was said (every message has a role)."""


class IndexHeader(msgspec.Struct):
    """The index's checkpoint: which store it indexes and the last log sequence folded, by which
    format and Unicode database (``UNICODE``) its words were split."""

    format: int
    store_id: str | None
    folded_seq: int
    unicode: str | None = None

    def foreign(self) -> str | None:
        """Why words this interpreter splits may not be the ones the index holds (None: they are)."""

        if self.format != FORMAT:
            return f"it is of format {self.format}, this program reads format {FORMAT}"
        if self.unicode != UNICODE:
            return (
                f"its words were split by Unicode {self.unicode}, this Python splits them by "
                f"Unicode {UNICODE}"
            )
        return None


_header_decoder: Final = msgspec.msgpack.Decoder(IndexHeader)
_encoder: Final = msgspec.msgpack.Encoder()


class Activity(msgspec.Struct):
    """A conversation's newest activity: the last commit that wrote it or an entry of its own."""

    conversationId: int
    lastSeq: int
    lastAt: int
    entries: int


def words(text: str) -> list[str]:
    """The words of ``text`` as the index keeps them: runs of letters and digits, lower-cased."""

    return [word[:MAX_WORD] for word in _WORDS.findall(text.lower())]


def strings_of(value: Any, skip: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every string in a JSON value (not its keys), depth first; values under ``skip`` keys are
    left out."""

    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(sub for key, sub in item.items() if key not in skip)
        elif isinstance(item, list):
            stack.extend(item)


def words_of(value: Any, skip: frozenset[str] = frozenset()) -> set[str]:
    found: set[str] = set()
    for text in strings_of(value, skip):
        found.update(words(text))
    return found


def holds(value: Any, wanted: Iterable[str]) -> bool:
    """Whether ``value``'s strings hold every word of ``wanted`` (as ``words`` reads them), each
    looked for until its first match: cheaper than reading every word of a long document."""

    texts = [text.lower() for text in strings_of(value)]
    for word in wanted:
        pattern = _pattern(word)
        if not any(pattern.search(text) for text in texts):
            return False
    return True


def _pattern(word: str) -> re.Pattern[str]:
    """A word where ``words`` would find it: not inside a longer word (a kept 64-character word
    may have been cut from a longer one)."""

    tail = "" if len(word) >= MAX_WORD else r"(?!\w)"
    return re.compile(r"(?<!\w)" + re.escape(word) + tail)


def entry_words(entry: Any) -> set[str]:
    """What an entry says: the text of its messages and its data."""

    found: set[str] = set()
    if isinstance(entry, dict):
        for name in ("model", "data"):
            if name in entry:
                found |= words_of(entry[name], _SKIPPED_KEYS)
    return found


def task_words(task: Any) -> tuple[set[str], set[str]]:
    """``(kind words, state words)`` of a task: its kind, its status and its outcome's status."""

    kind = words(str(task.get("kind", "")))
    state = task.get("state") if isinstance(task.get("state"), dict) else {}
    said = [str(state.get("status", ""))]
    outcome = state.get("outcome")
    if isinstance(outcome, dict) and isinstance(outcome.get("status"), str):
        said.append(outcome["status"])
    return set(kind), {word for text in said for word in words(text)}


def posting_key(word: str, kind: bytes, seq: int, id: int) -> bytes:
    return word.encode() + b"\x00" + kind + _PAIR.pack(_MAX - seq, id)


def word_prefix(word: str, kind: bytes) -> bytes:
    return word.encode() + b"\x00" + kind


def split_suffix(suffix: bytes) -> tuple[int, int]:
    """``(seq, id)`` of the 16 bytes after a posting's word and kind."""

    inverted, id = _PAIR.unpack(suffix)
    return _MAX - inverted, id


def suffix_from(seq: int) -> bytes:
    """The first posting suffix at or before ``seq`` (postings run newest first)."""

    return _PAIR.pack(_MAX - seq, 0)


DocumentAt = Callable[[int, int], Any]
"""``(document id, seq)``: the document's value as commit ``seq`` left it (None: unknown)."""


class SearchIndex:
    """The index of one store, opened (and created when ``create``) in its directory."""

    def __init__(self, store_path: str | os.PathLike[str], *, create: bool = False) -> None:
        self.path = os.path.join(os.path.abspath(store_path), INDEX_DIR)
        if not create and not os.path.isfile(os.path.join(self.path, "data.mdb")):
            raise FileNotFoundError(
                f"{store_path} has no search index (durable-log search PATH WORDS builds one)"
            )
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self.env = lmdb.open(self.path, map_size=MAP_SIZE, max_dbs=8, subdir=True)
        self.file = os.stat(os.path.join(self.path, "data.mdb")).st_ino
        # in a transaction of its own: while another process holds the index's writer lock,
        # waiting in ``begin`` lets other threads run (``open_db`` alone waits holding the GIL)
        with self.env.begin(write=True) as txn:
            self.postings = self.env.open_db(_POSTINGS, txn=txn)
            self.tasks = self.env.open_db(_TASKS, txn=txn)
            self.meta = self.env.open_db(_META, txn=txn)
            self.activity = self.env.open_db(_ACTIVITY, txn=txn)
            self.recent = self.env.open_db(_RECENT, txn=txn)
            self.values = self.env.open_db(_VALUES, txn=txn)

    def close(self) -> None:
        self.env.close()

    def replaced(self) -> bool:
        """Whether the index on disk is no longer the file this handle opened (another process
        compacted it, or it was deleted): reopen to see it."""

        try:
            return os.stat(os.path.join(self.path, "data.mdb")).st_ino != self.file
        except FileNotFoundError:
            return True

    def header(self, txn: lmdb.Transaction[bytes] | None = None) -> IndexHeader | None:
        if txn is None:
            with self.env.begin() as own:
                return self.header(own)
        raw = txn.get(_HEADER_KEY, db=self.meta)
        if raw is None:
            return None
        try:
            header = _header_decoder.decode(raw)
        except msgspec.DecodeError:
            raise SearchIndexError(
                f"The search index at {self.path} has an unreadable header; delete it to build it again"
            ) from None
        return header

    def check(self, txn: lmdb.Transaction[bytes]) -> None:
        """Refuse (``SearchIndexError``) to answer from an index whose words this interpreter
        would split otherwise: one built by another Python, or of another format. A catch-up
        (which needs write access) folds such an index again."""

        header = self.header(txn)
        why = None if header is None else header.foreign()
        if why is not None:
            raise SearchIndexError(
                f"The search index at {self.path} cannot answer this program: {why}. "
                "`durable-log search PATH WORDS` folds it again (or delete it)"
            )

    def reset(self, store_id: str | None, seen: IndexHeader | None) -> None:
        """Drop every posting, so the next fold starts from the log's first record; only while
        the header is still ``seen`` (another process may have reset and folded already)."""

        with self.env.begin(write=True) as txn:
            if self.header(txn) != seen:
                return
            for db in (self.postings, self.tasks, self.activity, self.recent, self.values):
                txn.drop(db, delete=False)
            txn.put(
                _HEADER_KEY,
                _encoder.encode(IndexHeader(FORMAT, store_id, 0, UNICODE)),
                db=self.meta,
            )

    def compact(self) -> None:
        """Rewrite the index with full pages (after a first build: postings land all over the
        tree, which leaves its pages half full and as many free): every database copied in key
        order into a fresh environment beside it, with LMDB's append, then swapped in."""

        staging = self.path + ".compacting"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging, mode=0o700)
        fresh = lmdb.open(staging, map_size=MAP_SIZE, max_dbs=8, subdir=True)
        try:
            tables = (
                (_POSTINGS, self.postings),
                (_TASKS, self.tasks),
                (_META, self.meta),
                (_ACTIVITY, self.activity),
                (_RECENT, self.recent),
                (_VALUES, self.values),
            )
            for name, source in tables:
                target = fresh.open_db(name)
                with self.env.begin() as reading:
                    rows = reading.cursor(source).iternext()
                    while True:
                        batch = list(itertools.islice(rows, 200_000))
                        if not batch:
                            break
                        with fresh.begin(write=True) as writing:
                            writing.cursor(target).putmulti(batch, append=True)
            fresh.sync(True)
        finally:
            fresh.close()
        self.env.close()
        retired = self.path + ".retired"
        shutil.rmtree(retired, ignore_errors=True)
        os.rename(self.path, retired)
        os.rename(staging, self.path)
        shutil.rmtree(retired, ignore_errors=True)
        self._open()

    def size(self) -> int:
        """Bytes the index takes on disk."""

        return os.path.getsize(os.path.join(self.path, "data.mdb"))

    def fold(
        self, commits: list[Commit], folded: int, store_id: str | None, document_at: DocumentAt
    ) -> bool:
        """Fold ``commits`` (the records after ``folded``) in one write transaction with the new
        checkpoint; False (nothing written) when another process moved the checkpoint first."""

        folder = _Folder(document_at)
        with self.env.begin(write=True) as txn:
            header = self.header(txn)
            if header is None or header.folded_seq != folded or header.foreign() is not None:
                return False
            for commit in commits:
                folder.fold(txn, self, commit)
            folder.keep(txn, self)
            txn.put(
                _HEADER_KEY,
                _encoder.encode(IndexHeader(FORMAT, store_id, commits[-1].seq, UNICODE)),
                db=self.meta,
            )
        return True

    def active(self, txn: lmdb.Transaction[bytes], skip: int, count: int) -> list[Activity]:
        """``count`` conversations by their newest activity, newest first, after the first ``skip``."""

        found: list[Activity] = []
        cursor = txn.cursor(self.recent)
        if not cursor.first():
            return found
        for index, key in enumerate(cursor.iternext(values=False)):
            if index < skip:
                continue
            if len(found) >= count:
                break
            id = _PAIR.unpack(key)[1]
            raw = txn.get(_U64.pack(id), db=self.activity)
            if raw is not None:
                seq, entries, ms = _ACTIVE.unpack(raw)
                found.append(Activity(id, seq, ms, entries))
        return found

    def task_words(self, txn: lmdb.Transaction[bytes], id: int, at: int) -> set[str] | None:
        """The words of task ``id``'s kind and state as of sequence ``at`` (None: no task yet)."""

        raw = _task_row(txn, self.tasks, id, at)
        return None if raw is None else set(raw.decode().replace("\x00", " ").split())

    def conversations(self, txn: lmdb.Transaction[bytes]) -> int:
        return int(txn.stat(self.activity)["entries"])

    def walk(
        self, txn: lmdb.Transaction[bytes], word: str, kind: bytes, as_of: int
    ) -> Iterator[tuple[int, int, bytes]]:
        """``(seq, id, value)`` of ``word``'s postings of ``kind`` at or before ``as_of``, newest first."""

        prefix = word_prefix(word, kind)
        cursor = txn.cursor(self.postings)
        if not cursor.set_range(prefix + suffix_from(as_of)):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            seq, id = split_suffix(key[len(prefix) :])
            yield seq, id, value

    def join(
        self, txn: lmdb.Transaction[bytes], terms: list[str], kind: bytes, as_of: int
    ) -> Iterator[tuple[int, int, bytes]]:
        """Postings of ``kind`` that every word of ``terms`` has at the same ``(seq, id)``
        (an entry's words all do), newest first: a zig-zag over one cursor per word, each
        seeking to the greatest suffix another found, so the rarest word bounds the work."""

        prefixes = [word_prefix(word, kind) for word in terms]
        cursors = [txn.cursor(self.postings) for _ in terms]
        target = suffix_from(as_of)
        agreed = 0
        index = 0
        while True:
            prefix, cursor = prefixes[index], cursors[index]
            if not cursor.set_range(prefix + target):
                return
            key = cursor.key()
            if not key.startswith(prefix):
                return
            found = key[len(prefix) :]
            if found == target:
                agreed += 1
            else:
                target, agreed = found, 1
            if agreed == len(terms):
                seq, id = split_suffix(target)
                yield seq, id, cursor.value()
                if _PAIR.unpack(target) == (_MAX, _MAX):
                    return
                target = _successor(target)
                agreed = 0
            index = (index + 1) % len(terms)


def _task_row(txn: lmdb.Transaction[bytes], db: lmdb._Database, id: int, at: int) -> bytes | None:
    """Task ``id``'s row in force at sequence ``at`` (its newest at or before it)."""

    cursor = txn.cursor(db)
    upper = _PAIR.pack(id, at)
    if cursor.set_range(upper):
        if cursor.key() != upper and not cursor.prev():
            return None
    elif not cursor.last():
        return None
    key = cursor.key()
    return cursor.value() if key[:8] == _U64.pack(id) else None


def _successor(suffix: bytes) -> bytes:
    inverted, id = _PAIR.unpack(suffix)
    return _PAIR.pack(inverted, id + 1) if id < _MAX else _PAIR.pack(inverted + 1, 0)


class _Folder:
    """Turns commits into postings; keeps the documents' values it has seen during one catch-up,
    so a run of deltas is applied here instead of read back from the store each time."""

    def __init__(self, document_at: DocumentAt) -> None:
        self.document_at = document_at
        self.values: dict[int, Any] = {}
        self.words: dict[int, set[str]] = {}
        self.current_only: set[int] = set()
        """Current-only documents seen in this catch-up: their values are kept in the index."""
        self.retired: set[int] = set()

    def known(self, txn: lmdb.Transaction[bytes], index: SearchIndex, id: int) -> Any:
        """Document ``id``'s last folded value: this catch-up's, else the one the index keeps
        (current-only documents); ``_UNKNOWN`` when neither holds it."""

        if id in self.values:
            return self.values[id]
        raw = txn.get(_U64.pack(id), db=index.values)
        if raw is None:
            return _UNKNOWN
        try:
            value = codec.decode_bounded(raw)
        except (msgspec.DecodeError, ValueError):
            raise SearchIndexError(
                f"The search index at {index.path} holds an unreadable value of document {id}; "
                "delete it to build it again"
            ) from None
        self.values[id], self.words[id] = value, words_of(value)
        self.current_only.add(id)
        return value

    def keep(self, txn: lmdb.Transaction[bytes], index: SearchIndex) -> None:
        """Write the current-only documents' last values (dropping the retired ones)."""

        for id in self.retired:
            txn.delete(_U64.pack(id), db=index.values)
        for id in self.current_only:
            txn.put(_U64.pack(id), codec.encode(self.values[id]), db=index.values)

    def fold(self, txn: lmdb.Transaction[bytes], index: SearchIndex, commit: Commit) -> None:
        seq = commit.seq
        put = txn.put
        db = index.postings
        touched: dict[int, int] = {}
        for write in commit.writes:
            match write:
                case ConversationWrite():
                    touched.setdefault(int(write.value["id"]), 0)
                case EntryWrite():
                    entry = write.value
                    conversation = int(entry["conversationId"])
                    touched[conversation] = touched.get(conversation, 0) + 1
                    for word in entry_words(entry):
                        put(posting_key(word, ENTRY, seq, int(entry["id"])), b"", db=db)
                case TaskWrite():
                    self._task(txn, index, seq, write.value)
                case DocumentCreateWrite() | DocumentCopyWrite() | DocumentChangeWrite():
                    self._document(txn, index, seq, write)
                case DocumentRetireWrite():
                    self.values.pop(write.id, None)
                    self.words.pop(write.id, None)
                    self.current_only.discard(write.id)
                    self.retired.add(write.id)
                case SubmissionWrite():
                    pass  # submissions are not searched
                case _:
                    assert_never(write)
        for conversation, added in touched.items():
            key = _U64.pack(conversation)
            raw = txn.get(key, db=index.activity)
            entries = added
            if raw is not None:
                last, before, _ = _ACTIVE.unpack(raw)
                entries += before
                txn.delete(_PAIR.pack(_MAX - last, conversation), db=index.recent)
            txn.put(key, _ACTIVE.pack(seq, entries, commit.committed_at), db=index.activity)
            txn.put(_PAIR.pack(_MAX - seq, conversation), b"", db=index.recent)

    def _task(self, txn: lmdb.Transaction[bytes], index: SearchIndex, seq: int, task: Any) -> None:
        id = int(task["id"])
        kind_words, state_words = task_words(task)
        said = (
            " ".join(sorted(kind_words)).encode() + b"\x00" + " ".join(sorted(state_words)).encode()
        )
        before = _task_row(txn, index.tasks, id, seq)
        if before == said:
            return
        txn.put(_PAIR.pack(id, seq), said, db=index.tasks)
        new = state_words | (kind_words if before is None else set())
        for word in new:
            txn.put(posting_key(word, TASK, seq, id), b"", db=index.postings)

    def _document(
        self, txn: lmdb.Transaction[bytes], index: SearchIndex, seq: int, write: Any
    ) -> None:
        if isinstance(write, DocumentChangeWrite):
            id = write.id
            content = write.content
            before = self.known(txn, index, id)
            if isinstance(content, BaseContent):
                value = content.value
            elif before is not _UNKNOWN:
                try:
                    value = apply_ops(before, content.ops)
                except Exception:  # a delta the store also refused to apply: its value stands
                    value = before
            else:
                value = self.document_at(id, seq)
            previous = self.words.get(id)
            if previous is None:
                previous = words_of(self.document_at(id, seq - 1))
        else:
            id = write.record["id"]
            self.retired.discard(id)
            if is_current_only(write.record):
                self.current_only.add(id)
            else:
                self.current_only.discard(id)
            if isinstance(write, DocumentCreateWrite):
                content = write.content
                value = (
                    content.value if isinstance(content, BaseContent) else self.document_at(id, seq)
                )
            else:
                value = self.document_at(id, seq)
                if value is None and write.source.at == "current":
                    # a current-only document is refused at a point: its copy is the source's value
                    source = self.known(txn, index, write.source.id)
                    value = None if source is _UNKNOWN else source
            previous = set()
        found = words_of(value)
        self.values[id], self.words[id] = value, found
        for word in found - previous:
            txn.put(posting_key(word, DOCUMENT, seq, id), b"", db=index.postings)


_UNKNOWN: Final = object()
"""What ``_Folder.known`` returns for a document whose last value it cannot tell."""


def all_words(query: str) -> list[str]:
    """A query's distinct words, in the order given."""

    return list(dict.fromkeys(words(query)))


__all__ = [
    "CHUNK",
    "DOCUMENT",
    "ENTRY",
    "FORMAT",
    "INDEX_DIR",
    "KIND_NAMES",
    "MAP_SIZE",
    "MAX_WORD",
    "TASK",
    "Activity",
    "DocumentAt",
    "IndexHeader",
    "SearchIndex",
    "all_words",
    "entry_words",
    "holds",
    "posting_key",
    "split_suffix",
    "strings_of",
    "suffix_from",
    "task_words",
    "word_prefix",
    "words",
    "words_of",
]
