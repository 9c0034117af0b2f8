"""Keeping the core projections level with the log, and rebuilding them when their schema changes.

The ``projections`` database holds a ``CoreHeader``: the generation of tables that serves reads
and, during a rebuild, the generation being built beside it. A rebuild folds the whole log into
the new generation in chunks (each chunk commits its checkpoint with its rows, so a killed rebuild
resumes where it stopped) and swaps in one transaction at the end, dropping the old tables. Until
the swap, the old generation is untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import lmdb

from ..errors import ProjectionsBehind, StoreFormatError
from ..log import Environment, WriteLog
from . import tables as t
from .base import load_base
from .projector import Projector
from .readmodel import ReadModel

_log = logging.getLogger(__name__)

REGISTRY_DB = "projections"
CORE_KEY = b"core"
FOLD_CHUNK = 2048
"""Records folded per write transaction while catching up or rebuilding."""

Progress = Callable[[int, int], None]


def read_header(env: Environment) -> t.CoreHeader | None:
    if env.readonly and not env.has_db(REGISTRY_DB):
        return None
    db = env.db(REGISTRY_DB)  # opening a database needs its own transaction: first
    with env.read() as txn:
        raw = txn.get(CORE_KEY, db=db)
    return None if raw is None else t.header_decoder.decode(raw)


def _put_header(txn: lmdb.Transaction[bytes], env: Environment, header: t.CoreHeader) -> None:
    txn.put(CORE_KEY, t.encode_state(header), db=env.db(REGISTRY_DB))


def projection_state(txn: lmdb.Transaction[bytes], model: ReadModel) -> t.ProjectionState | None:
    raw = txn.get(t.STATE_KEY, db=model.db[t.STATE])
    return None if raw is None else t.state_decoder.decode(raw)


def folded_through(
    txn: lmdb.Transaction[bytes], log: WriteLog, state: t.ProjectionState | None
) -> int:
    """The last sequence a model has folded, by its ``state`` read in ``txn``: the log's head in
    that snapshot when it folds in lockstep with every commit."""

    if state is not None and state.lockstep:
        return log.head(txn)
    return 0 if state is None else state.folded_seq


def folded_seq(env: Environment, log: WriteLog, model: ReadModel) -> int:
    with env.read() as txn:
        return folded_through(txn, log, projection_state(txn, model))


def mark_lockstep(txn: lmdb.Transaction[bytes], model: ReadModel) -> None:
    state = t.ProjectionState(t.SCHEMA_VERSION, 0, lockstep=True)
    txn.put(t.STATE_KEY, t.encode_state(state), db=model.db[t.STATE])


def open_core(
    env: Environment, log: WriteLog, progress: Progress | None = None, verify_checksums: bool = True
) -> ReadModel:
    """The read model of the active generation, brought level with the log (writers), or
    checked to be level (read-only opens, which refuse otherwise)."""

    header = read_header(env)
    if env.readonly:
        if header is None or header.schema_version != t.SCHEMA_VERSION:
            found = "none" if header is None else header.schema_version
            raise ProjectionsBehind(
                f"The projections of {env.path} have schema {found}, this program reads "
                f"{t.SCHEMA_VERSION}; open the store for writing once to rebuild them"
            )
        model = _open_generation(env, header, verify_checksums)
        txn, model, _ = begin_following(env, model)  # a rebuild elsewhere may swap meanwhile
        with txn:  # one snapshot, or a commit in between looks like a lag
            head = log.head(txn)
            folded = folded_through(txn, log, projection_state(txn, model))
        if folded < head:
            raise ProjectionsBehind(
                f"The projections of {env.path} are behind the log (folded {folded} of {head}); "
                "open the store for writing once to bring them up to date"
            )
        return model
    if header is None:
        header = fresh = t.CoreHeader(0, t.SCHEMA_VERSION)
        env.write(lambda txn: _put_header(txn, env, fresh))
    if header.schema_version != t.SCHEMA_VERSION or header.building is not None:
        rebuild(env, log, progress)
        header = read_header(env)
        assert header is not None
    model = ReadModel(env, header.generation, verify_checksums)
    catch_up(env, log, model, progress)
    with env.read() as txn:
        state = projection_state(txn, model)
    if state is None or not state.lockstep:
        env.write(lambda txn: mark_lockstep(txn, model))
    return model


def follow_swap(env: Environment, model: ReadModel, raw: bytes | None) -> ReadModel:
    """The read model a reader should use, given the core header ``raw`` its snapshot holds:
    ``model`` while its generation is active, the new generation after a rebuild swapped."""

    header = None if raw is None else t.header_decoder.decode(raw)
    if header is None or header.schema_version != t.SCHEMA_VERSION:
        found = "none" if header is None else header.schema_version
        raise ProjectionsBehind(
            f"The projections of {env.path} were rebuilt with schema {found}; this program reads "
            f"{t.SCHEMA_VERSION}; close this store and open it with a program of that schema"
        )
    if header.generation == model.generation:
        return model
    return _open_generation(env, header, model.checked)


def _open_generation(env: Environment, header: t.CoreHeader, checked: bool) -> ReadModel:
    """The read model of ``header``'s generation, or of a newer one: a rebuild in another process
    may swap and drop a generation between reading its header and opening its tables, and a
    vanished generation is looked up again in the header that replaced it."""

    while True:
        try:
            return ReadModel(env, header.generation, checked)
        except StoreFormatError:
            now = read_header(env)
            if now is None or now.generation == header.generation:
                raise
            header = now


def begin_following(
    env: Environment, model: ReadModel, known: bytes | None = None
) -> tuple[lmdb.Transaction[bytes], ReadModel, bytes | None]:
    """A read transaction, the read model of the generation its snapshot names, and that core
    header (pass it back as ``known``: while it is unchanged, nothing is decoded).

    A reader's handles outlive the tables a rebuild by the writer swaps out and drops; a table
    opened after a transaction began is not usable in it, so a swap begins a new one.
    """

    registry = env.db(REGISTRY_DB)
    txn = env.read()
    raw = txn.get(CORE_KEY, db=registry)
    while raw != known:
        try:
            current = follow_swap(env, model, raw)
        except BaseException:
            txn.abort()
            raise
        if current is model:  # the same generation (a rebuild began, or gave up)
            break
        txn.abort()
        model = current
        txn = env.read()
        raw = txn.get(CORE_KEY, db=registry)
    return txn, model, raw


class Following:
    """A read-only reader's core read model, kept on the generation each read's snapshot names:
    a rebuild by the writer in another process swaps generations and drops the old tables."""

    def __init__(self, env: Environment, log: WriteLog) -> None:
        self.env, self.log = env, log
        self.model: ReadModel | None = None
        self._known: bytes | None = None

    def read(self) -> tuple[lmdb.Transaction[bytes], ReadModel]:
        """A read transaction (the caller ends it) and the read model its snapshot serves."""

        if self.model is None:
            self.model = open_core(self.env, self.log)
        txn, self.model, self._known = begin_following(self.env, self.model, self._known)
        return txn, self.model


def catch_up(
    env: Environment,
    log: WriteLog,
    model: ReadModel,
    progress: Progress | None = None,
    last: int | None = None,
) -> int:
    """Fold every record ``model`` lacks (up to ``last``; default: the head), a chunk per
    transaction, in ``env`` (``model``'s environment, which may be another than the log's);
    returns how many. Fresh tables of a trimmed log take its base first (``projections.base``)."""

    projector = Projector(model)
    with env.read() as txn:
        state = projection_state(txn, model)
    if state is None:
        load_base(model, log)
    with env.read() as txn:
        folded = folded_through(txn, log, projection_state(txn, model))
    head = log.head() if last is None else last
    done = 0
    while folded < head:
        commits = log.take(folded + 1, head, FOLD_CHUNK)

        env.write(lambda txn: projector.fold(txn, commits, check=False))
        folded = commits[-1].seq
        done += len(commits)
        if progress is not None:
            progress(folded, head)
    return done


def schedule_rebuild(txn: lmdb.Transaction[bytes], env: Environment) -> None:
    """Inside ``txn``: mark a rebuild of the core projections begun and not yet folded, so that
    ``rebuild`` (or, should this process die first, the next writer's open) folds the whole log
    into a fresh generation and swaps it in; until then the active generation serves reads."""

    raw = txn.get(CORE_KEY, db=env.db(REGISTRY_DB))
    header = t.CoreHeader(0, t.SCHEMA_VERSION) if raw is None else t.header_decoder.decode(raw)
    target = header.generation + 1 if header.building is None else header.building
    env.drop_dbs(txn, [t.db_name(target, name) for name in t.TABLES])
    env.forget_dbs([t.db_name(target, name) for name in t.TABLES])
    _put_header(txn, env, t.CoreHeader(header.generation, header.schema_version, target))


def rebuild(env: Environment, log: WriteLog, progress: Progress | None = None) -> ReadModel:
    """Fold the whole log into a new generation beside the active one, then swap."""

    header = read_header(env) or t.CoreHeader(0, t.SCHEMA_VERSION)
    target = header.generation + 1 if header.building is None else header.building
    building = ReadModel(env, target)
    with env.read() as txn:
        state = projection_state(txn, building)
    restart = state is not None and state.schema_version != t.SCHEMA_VERSION

    def begin(txn: lmdb.Transaction[bytes]) -> None:
        if restart:
            for name in t.TABLES:
                txn.drop(building.db[name], delete=False)
        _put_header(txn, env, t.CoreHeader(header.generation, header.schema_version, target))

    env.write(begin)
    _log.info(
        "rebuilding the projections of %s: generation %d, schema %d, from %d records",
        env.path,
        target,
        t.SCHEMA_VERSION,
        log.head(),
    )
    try:
        catch_up(env, log, building, progress)
    except BaseException as error:
        if isinstance(error, Exception):
            _log.error(
                "rebuilding the projections of %s failed; the store keeps its generation %d",
                env.path,
                header.generation,
                exc_info=True,
            )
        # A damaged record, or Ctrl-C (only a kill leaves the build to resume on the next open):
        # keep the store writable as it was.
        abandon(env, header, target)
        raise
    old = [t.db_name(header.generation, name) for name in t.TABLES]
    env.forget_dbs(old)

    def swap(txn: lmdb.Transaction[bytes]) -> None:
        env.drop_dbs(txn, old)
        _put_header(txn, env, t.CoreHeader(target, t.SCHEMA_VERSION))
        mark_lockstep(txn, building)

    env.write(swap)
    _log.info("rebuilt the projections of %s: generation %d is active", env.path, target)
    return building


def abandon(env: Environment, header: t.CoreHeader, target: int) -> None:
    """Forget a rebuild that failed: drop what it built and keep serving the active generation."""

    partial = [t.db_name(target, name) for name in t.TABLES]
    env.forget_dbs(partial)

    def drop(txn: lmdb.Transaction[bytes]) -> None:
        env.drop_dbs(txn, partial)
        _put_header(txn, env, t.CoreHeader(header.generation, header.schema_version))

    env.write(drop)


__all__ = [
    "CORE_KEY",
    "FOLD_CHUNK",
    "REGISTRY_DB",
    "Following",
    "Progress",
    "abandon",
    "begin_following",
    "catch_up",
    "folded_seq",
    "folded_through",
    "follow_swap",
    "mark_lockstep",
    "open_core",
    "projection_state",
    "read_header",
    "rebuild",
    "schedule_rebuild",
]
