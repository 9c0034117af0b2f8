"""The package's own errors form one tree (``pi_durable_lmdb.errors``): one root, four families
and the store's state, each class exported from ``pi_durable_lmdb`` and saying when it is raised
and what to do; old import paths keep working."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pi_durable.delta
import pi_durable.errors
import pi_durable_lmdb
import pytest
from pi_durable_lmdb import errors

FAMILIES = (
    errors.DamageError,
    errors.OwnershipError,
    errors.ReplicationError,
    errors.BadInputError,
    errors.StoreStateError,
)
CLASSES = [
    value
    for _, value in inspect.getmembers(errors, inspect.isclass)
    if value.__module__ == errors.__name__
]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_is_in_the_tree_exported_and_documented(cls: type) -> None:
    assert issubclass(cls, errors.DurableLmdbError)
    assert cls is errors.DurableLmdbError or cls in FAMILIES or issubclass(cls, FAMILIES), (
        f"{cls.__name__} has no family"
    )
    assert getattr(pi_durable_lmdb, cls.__name__) is cls
    doc = inspect.getdoc(cls) or ""
    assert len(doc.split()) >= 8, f"{cls.__name__} does not say when it is raised and what to do"


def test_the_families_the_issue_names() -> None:
    damage = {errors.CorruptRecordError, errors.CorruptProjectionError, errors.StoreDamagedError}
    ownership = {errors.WriterLockedError, errors.NotWriterError, errors.LeaseLapsedError}
    assert all(issubclass(cls, errors.DamageError) for cls in damage)
    assert all(issubclass(cls, errors.OwnershipError) for cls in ownership)
    assert issubclass(errors.StoreFormatError, ValueError) and issubclass(
        errors.BadInputError, ValueError
    )


def test_old_import_paths_and_bases_keep_working() -> None:
    from pi_durable_lmdb.log import LogError, StoreFormatError, WriterLockedError
    from pi_durable_lmdb.log.stream.jetstream import OutcomeUnknownError, ReplicationError
    from pi_durable_lmdb.log.stream.lease import LeaseLapsedError
    from pi_durable_lmdb.log.stream.position import NotWriterError
    from pi_durable_lmdb.projections.readmodel import CorruptProjectionError
    from pi_durable_lmdb.projections.rebuild import ProjectionsBehind
    from pi_durable_lmdb.projections.user import ProjectionFailed

    assert LogError is errors.DurableLmdbError and WriterLockedError is errors.WriterLockedError
    assert issubclass(errors.TruncatedStoreError, StoreFormatError) and issubclass(
        errors.WrongStoreError, StoreFormatError
    )
    assert issubclass(NotWriterError, ReplicationError) and issubclass(
        NotWriterError, PermissionError
    )
    assert issubclass(LeaseLapsedError, NotWriterError) and issubclass(
        OutcomeUnknownError, errors.NatsUnavailableError
    )
    assert issubclass(errors.StoreFullError, OSError) and issubclass(
        errors.StoreClosedError, RuntimeError
    )
    for cls in (CorruptProjectionError, ProjectionsBehind, ProjectionFailed):
        assert getattr(errors, cls.__name__) is cls


def test_the_contract_errors_stay_pi_durables() -> None:
    """The same classes, not look-alikes: a host catches one class whichever backend it runs."""

    from pi_durable_lmdb.projections import StorageRequestError, delta

    assert (
        pi_durable_lmdb.StorageRequestError
        is StorageRequestError
        is pi_durable.errors.StorageRequestError
    )
    assert delta.PathError is pi_durable.delta.PathError
    assert delta.UnsafePathError is pi_durable.delta.UnsafePathError
    assert not issubclass(pi_durable_lmdb.StorageRequestError, errors.DurableLmdbError)


def test_no_module_but_the_tree_defines_a_public_error() -> None:
    """One module holds the package's errors: any other module defines at most private
    control-flow exceptions (``_Name``) that never leave it."""

    source = Path(pi_durable_lmdb.__file__).parent
    found = []
    for path in sorted(source.rglob("*.py")):
        if path == source / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
                if node.name.endswith("Error") or bases & {
                    "Exception",
                    "BaseException",
                    "ValueError",
                    "RuntimeError",
                }:
                    found.append(f"{path.relative_to(source)}: {node.name}")
    assert not found, f"errors defined outside pi_durable_lmdb.errors: {found}"
