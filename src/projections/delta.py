"""Chord-style JSON delta batches, applied exactly as pi-durable's reference applier does.

Projections replay persisted batches, so a document materialized here must be byte-for-byte what
pi-durable itself would materialize, and a batch it rejects must fail with the same exception
(``UnsafePathError`` and ``PathError`` are pi-durable's own classes, re-exported here).
The verbs are ``r`` (replace root), ``s`` (set), ``d`` (delete), ``a`` (append text), ``t``
(trim text from the front), ``p`` (splice an array) and ``m`` (permute an array).

Behaviours kept on purpose because the reference has them:

* ``t`` removes ``count`` Python code points, not UTF-16 code units: an astral character counts
  as one, and so does each lone surrogate.
* A missing object key in the middle of a path raises ``KeyError``; ``s`` at index ``len`` of an
  array and ``a``/``t`` there raise ``IndexError``; ``p`` clamps an index past the end.
* A path prefix that cannot be walked reports that prefix, not the whole path.
* An integer segment addressing an object sets or deletes an integer key there, and the value
  then holds a key JSON cannot: the reference's store raises ``TypeError`` (``NON_STRING_KEYS``)
  when a read copies such a value out, and reads it again once a later op removed the key. A
  replay (``apply_batches``) does the same: it sets the key and raises at its end if one is
  left. A commit's own apply (``apply_ops``, ``Folding.apply``) refuses the set itself with that
  ``TypeError``, before it changes anything: the store marks the document broken, so its
  reads replay, and no value it keeps holds such a key (it could not encode or read one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, TypeAlias

from pi_durable.delta import PathError, UnsafePathError

from ..log import codec
from ..log.records import check_delta_depth

Json: TypeAlias = Any
Op: TypeAlias = list[Any]
Path: TypeAlias = list[str | int]

RESERVED_SEGMENTS = frozenset({"__proto__", "constructor", "prototype"})

_SCALARS = frozenset({str, int, float, bool, type(None)})

NON_STRING_KEYS: Final = "Value must contain strict JSON string keys"
"""What pi-durable raises (``TypeError``) copying out a value with a key that is not a string."""


def copy_json(value: Json) -> Json:
    """Deep-copy a JSON tree so the result shares no container with its source; a tree nested
    past the default stack (commits accept up to ``codec.MAX_DEPTH``) is copied with room."""

    return codec.deep(_copy, value)


def _copy(value: Json) -> Json:
    kind = type(value)
    if kind is dict:
        return {key: item if type(item) in _SCALARS else _copy(item) for key, item in value.items()}
    if kind is list:
        return [item if type(item) in _SCALARS else _copy(item) for item in value]
    if kind in _SCALARS:
        return value
    return _copy_subclassed(value)


def _copy_subclassed(value: object) -> Json:
    """Turn container subclasses (frozen JSON) into plain ones; refuse what JSON cannot hold."""

    if isinstance(value, dict):
        return {str(key): _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    if isinstance(value, (str, int, float)):
        return value
    raise TypeError(f"Value contains a non-JSON {type(value).__name__}; expected strict JSON")


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise TypeError(message)


def _check_path(path: Any, *, non_empty: bool = True) -> None:
    # ``_require`` written out on the paths every commit's ops take: a call per check was a
    # third of validating an op.
    if not isinstance(path, list):
        raise TypeError("path is not an array")
    if non_empty and not path:
        raise TypeError("path is empty")
    for segment in path:
        if isinstance(segment, str):
            if segment in RESERVED_SEGMENTS:
                raise UnsafePathError(segment)
        elif not _is_index(segment):
            raise UnsafePathError(segment)


def _check_r(op: Op) -> None:
    _require(len(op) == 2, "r arity")


def _check_s(op: Op) -> None:
    if len(op) != 3:
        raise TypeError("s arity")
    _check_path(op[1])


def _check_d(op: Op) -> None:
    _require(len(op) == 2, "d arity")
    _check_path(op[1])


def _check_a(op: Op) -> None:
    if len(op) != 3 or not isinstance(op[2], str):
        raise TypeError("a shape")
    _check_path(op[1])


def _check_t(op: Op) -> None:
    _require(len(op) == 3 and _is_index(op[2]), "t shape")
    _check_path(op[1])


def _check_p(op: Op) -> None:
    _require(len(op) == 5, "p arity")
    _check_path(op[1], non_empty=False)
    _require(_is_index(op[2]), "p index")
    _require(_is_index(op[3]), "p remove")
    _require(isinstance(op[4], list), "p items")


def _check_m(op: Op) -> None:
    _require(len(op) == 3, "m arity")
    _check_path(op[1], non_empty=False)
    order = op[2]
    _require(isinstance(order, list), "m permutation is not an array")
    size = len(order)
    bijective = (
        all(_is_index(index) and index < size for index in order) and len(set(order)) == size
    )
    _require(bijective, "m permutation is not a bijection")


_VALIDATORS: dict[str, Callable[[Op], None]] = {
    "r": _check_r,
    "s": _check_s,
    "d": _check_d,
    "a": _check_a,
    "t": _check_t,
    "p": _check_p,
    "m": _check_m,
}


def validate_op(op: Any) -> None:
    """Reject a malformed operation before it touches the document."""

    if not isinstance(op, list) or not op:
        raise TypeError("op is not a tuple")
    verb = op[0]
    check = _VALIDATORS.get(verb) if isinstance(verb, str) else None
    if check is None:
        raise TypeError(f"unknown op verb: {verb}")
    check(op)


def _resolve(root: Json, path: Path) -> Json:
    """Walk ``path``; a missing object key raises ``KeyError`` as the reference's lookup does."""

    node = root
    for segment in path:
        if isinstance(segment, str) and isinstance(node, dict):
            node = node[segment]
        elif isinstance(segment, int) and isinstance(node, list) and segment < len(node):
            node = node[segment]
        else:
            raise PathError(list(path))
    return node


def _array_at(root: Json, path: Path) -> list[Json]:
    node = _resolve(root, path)
    if not isinstance(node, list):
        raise PathError(path)
    return node


def _member(root: Json, path: Path) -> tuple[dict[Any, Json] | list[Json], Any]:
    """Find the container holding the path's last segment, checking that segment fits it."""

    parent = _resolve(root, path[:-1])
    key = path[-1]
    if isinstance(parent, list):
        if isinstance(key, str) or key > len(parent):
            raise UnsafePathError(key)
    elif not isinstance(parent, dict):
        raise PathError(path)
    return parent, key


def _replace(root: Json, op: Op) -> Json:
    return copy_json(op[1])


def _set(root: Json, op: Op) -> Json:
    return _set_key(root, op, False)[0]


def _set_key(root: Json, op: Op, any_key: bool) -> tuple[Json, bool]:
    """``s``: the root, and whether it set an integer key in an object, which only ``any_key``
    (a replay's, as the reference applies it) allows."""

    parent, key = _member(root, op[1])
    keyed = isinstance(parent, dict) and type(key) is int
    if keyed and not any_key:
        raise TypeError(NON_STRING_KEYS)
    parent[key] = copy_json(op[2])
    return root, keyed


def _holds_non_string_key(value: Json) -> bool:
    """Whether an object in ``value`` has a key that is not a string (found without recursion)."""

    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            for key, item in node.items():
                if type(key) is not str:
                    return True
                if type(item) is dict or type(item) is list:
                    stack.append(item)
        elif type(node) is list:
            stack.extend(item for item in node if type(item) is dict or type(item) is list)
    return False


def unreadable_value(error: BaseException) -> bool:
    """Whether ``error`` is a replay's ``TypeError`` for a value holding a key that is not a
    string, which the reference raises copying the value out, not resolving it (a copy of such
    a document fails with it, unwrapped, once the batch's copies are resolved)."""

    return type(error) is TypeError and error.args == (NON_STRING_KEYS,)


def _delete(root: Json, op: Op) -> Json:
    parent, key = _member(root, op[1])
    if isinstance(parent, dict):
        parent.pop(key, None)
    elif key < len(parent):
        del parent[key]
    else:
        raise PathError(op[1])
    return root


def _edit_text(edit: Callable[[str, Any], str]) -> Callable[[Json, Op], Json]:
    def apply_edit(root: Json, op: Op) -> Json:
        parent, key = _member(root, op[1])
        current = parent.get(key) if isinstance(parent, dict) else parent[key]
        if not isinstance(current, str):
            raise PathError(op[1])
        parent[key] = edit(current, op[2])
        return root

    return apply_edit


def _append(text: str, suffix: str) -> str:
    """Every text append of a fold goes through here: it copies ``len(text + suffix)``
    characters, the unit replay costs are counted in (tests count them)."""

    return text + suffix


def _splice(root: Json, op: Op) -> Json:
    _, path, index, remove, items = op
    _array_at(root, path)[index : index + remove] = copy_json(items)
    return root


def _permute(root: Json, op: Op) -> Json:
    path, order = op[1], op[2]
    array = _resolve(root, path)
    if not isinstance(array, list) or len(array) != len(order):
        raise PathError(path)
    array[:] = [array[source] for source in order]
    return root


_APPLIERS: dict[str, Callable[[Json, Op], Json]] = {
    "r": _replace,
    "s": _set,
    "d": _delete,
    "a": _edit_text(lambda text, suffix: _append(text, suffix)),
    "t": _edit_text(lambda text, count: text[count:]),
    "p": _splice,
    "m": _permute,
}


def apply_ops(root: Json, ops: Iterable[Op]) -> Json:
    """Apply one batch of a commit in place and return the root, which ``r`` may have replaced.

    Each op is validated just before it runs, so a failing op leaves earlier ones applied, as in
    the reference. Inserted payloads are copied so the tree never aliases the caller's ops. An
    ``s`` of an integer key in an object raises ``TypeError`` (see the module's notes), and so
    does, before any op runs, a batch nesting the value deeper than a commit may hold one
    (``records.check_delta_depth``: a commit refuses it; a log written before may hold it).
    """

    check_delta_depth(ops)
    for op in ops:
        validate_op(op)
        root = _APPLIERS[op[0]](root, op)
    return root


def apply_batches(root: Json, batches: Iterable[Iterable[Op]]) -> Json:
    """Replay ordered batches on a copy, leaving the caller's tree untouched (``Folding``: text
    appends are joined once, so a replay costs the bytes it reads, whatever the mix of ops).

    The value read, as the reference's store reads it: integer keys set in objects are kept
    while later ops may remove them, and ``TypeError`` is raised if one is left at the end."""

    folding = Folding(copy_json(root), replay=True)
    for ops in batches:
        folding.apply(ops)
    value = folding.joined()
    if folding.keyed and _holds_non_string_key(value):
        raise TypeError(NON_STRING_KEYS)
    return value


class Folding:
    """A document value being folded, its text appends kept pending until the value is read.

    Why: an append copies the whole text it extends, so a transcript that grows every turn
    replayed one append at a time cost its length times its turns, and a run of appends broken
    by any other op (``[["a", ["text"], line], ["s", ["turns"], n]]``, each turn) could not be
    joined. Here each path's appends wait in a list; before an op that can see or move a
    pending text, that path's appends are joined (``_join_under``): an op whose path is a
    prefix of the pending one (on the text, on a container holding it: ``r``, ``s``, ``d``,
    ``p``, ``m``), one under it, and a ``d`` of an element of an array holding it, before it
    (the elements after the deleted one shift down, the pending text with them). Nothing else
    can: a set, append or trim beside it, a delete after it, ops on other arrays. So a run of
    appends to one text stays pending through the other ops of each turn and costs its length
    once. The first append to a path is applied as it comes (it raises what the reference
    raises when the path holds no text); the ones after it cannot fail while nothing touched
    that path, so the value and any error are the reference's. A batch that raises leaves the
    folding spoiled: the caller drops it (a document's ``broken`` state).

    A commit's folding refuses an ``s`` of an integer key in an object as ``apply_ops`` does; a
    ``replay`` sets it, noting it in ``keyed`` (``apply_batches`` checks the value it ends
    with)."""

    __slots__ = ("keyed", "pending", "replay", "root")

    def __init__(self, root: Json, *, replay: bool = False) -> None:
        self.root = root
        """Owned: the caller hands over a tree nobody else holds."""
        self.pending: dict[tuple[str | int, ...], list[str]] = {}
        self.replay = replay
        self.keyed = False
        """Whether a replay set an integer key in an object (it may have been removed since)."""

    def apply(self, ops: Iterable[Op]) -> None:
        """Apply one batch in place (ops validated one by one, as ``apply_ops``)."""

        check_delta_depth(ops)
        pending = self.pending
        for op in ops:
            validate_op(op)
            verb = op[0]
            path = () if verb == "r" else tuple(op[1])
            if verb == "a" and path in pending:
                pending[path].append(op[2])
                continue
            if pending:
                self._join_under(path, verb)
            if verb == "s" and self.replay:
                self.root, keyed = _set_key(self.root, op, True)
                self.keyed = self.keyed or keyed
                continue
            self.root = _APPLIERS[verb](self.root, op)
            if verb == "a":
                pending[path] = []

    def _join_under(self, path: tuple[str | int, ...], verb: str) -> None:
        """Join the pending appends an op ``verb`` at ``path`` could see, change or move."""

        size = len(path)
        parent, last = path[:-1], path[-1] if path else None
        shifts = verb == "d" and type(last) is int
        for key in [
            key
            for key in self.pending
            if key[:size] == path
            or path[: len(key)] == key
            or (shifts and _after(key, parent, last))
        ]:
            suffixes = self.pending.pop(key)
            if suffixes:
                self.root = _join_appends(self.root, list(key), suffixes)

    def joined(self) -> Json:
        """The value with every pending append joined (the folding's own tree: the caller
        copies it before handing it out)."""

        for key, suffixes in self.pending.items():
            if suffixes:
                self.root = _join_appends(self.root, list(key), suffixes)
        self.pending.clear()
        return self.root


def _after(key: tuple[str | int, ...], parent: tuple[str | int, ...], index: Any) -> bool:
    """Whether ``key`` runs through an element of the array at ``parent`` after ``index``
    (deleting ``index`` moves it: an object's integer key moves nothing, but joining is safe)."""

    size = len(parent)
    if len(key) <= size or key[:size] != parent:
        return False
    at = key[size]
    return type(at) is int and at > index


def _join_appends(root: Json, path: Path, suffixes: list[str]) -> Json:
    return _APPLIERS["a"](root, ["a", path, "".join(suffixes)]) if suffixes else root


__all__ = [
    "NON_STRING_KEYS",
    "RESERVED_SEGMENTS",
    "Folding",
    "Op",
    "PathError",
    "UnsafePathError",
    "apply_batches",
    "apply_ops",
    "copy_json",
    "unreadable_value",
    "validate_op",
]
