"""The token guard of ``durable-log serve --token``, as a browser or an attacker meets it: a real
store, ``serve`` as a real process, raw HTTP requests (any request target, sent as written)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from pi_durable_lmdb.web.access import same_origin

from tests.support.served import Served, build_store, serve

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = tmp_path_factory.mktemp("access") / "store"
    build_store(path)
    with serve(path, "--token", TOKEN) as running:
        yield running


def _raw(
    served: Served, target: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    """``GET target`` with the target's bytes as given (no client tidies it): status, headers."""

    parts = urlsplit(served.url)
    lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as connection:
        connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape"))
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    found: dict[str, str] = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    return status, found


def _stays_here(location: str) -> bool:
    """A Location every browser resolves on the view's own origin: a path of one leading ``/``,
    not followed by another or by a backslash, with nothing a browser would strip out of it."""

    return (
        location.startswith("/")
        and location[1:2] not in ("/", "\\")
        and not any(c in location for c in "\\\t\r\n ")
        and all(0x20 < ord(c) < 0x7F for c in location)
    )


ODD_PATHS = [
    "//evil.example/x",
    "///evil.example/x",
    "/\\evil.example/",
    "/\\\\evil.example",
    "/\\/evil.example",
    "/%2F%2Fevil.example/x",
    "/%2f/evil.example",
    "/%5Cevil.example",
    "/%09/evil.example",
    "/\t/evil.example",
    "/ /evil.example",
    "/.//evil.example",
    "/%0D%0ALocation:%20//evil.example",
    "http://evil.example/x",
    "//evil.example:80@127.0.0.1/",
    "/log/..//evil.example",
    "/\u00e9//x",
]


@pytest.mark.parametrize("path", ODD_PATHS)
@pytest.mark.parametrize(
    "query, cookie",
    [
        (f"token={TOKEN}", None),
        (f"a=1&token={TOKEN}&b=%2F%2Fx", None),
        (f"token={TOKEN}", TOKEN),
        (f"token={TOKEN}", "wrong"),
    ],
)
def test_the_redirect_that_drops_the_token_never_leaves_the_views_origin(
    served: Served, path: str, query: str, cookie: str | None
) -> None:
    headers = {} if cookie is None else {"Cookie": f"durable_log_token={cookie}"}
    status, found = _raw(served, f"{path}?{query}", headers)
    if status == 303:
        assert _stays_here(found["location"]), (path, found["location"])
        assert "token" not in found["location"]
    else:  # a target the server refuses to parse: refused, never redirected
        assert status == 400 and "location" not in found, (path, status)


@pytest.mark.parametrize("path", ODD_PATHS)
def test_same_origin_keeps_every_odd_path_on_this_origin(path: str) -> None:
    assert _stays_here(same_origin(path)), same_origin(path)


def test_an_ordinary_address_keeps_its_path_and_other_parameters(served: Served) -> None:
    status, found = _raw(served, f"/log?kind=entry&token={TOKEN}&q=a%20b%26c")
    assert status == 303 and found["location"] == "/log?kind=entry&q=a+b%26c"
    status, found = _raw(served, f"/documents/3?token={TOKEN}")
    assert status == 303 and found["location"] == "/documents/3"


@pytest.mark.parametrize(
    "target, headers",
    [
        ("/?token=", {}),
        ("/?token=", {"Cookie": f"durable_log_token={TOKEN}"}),  # not treated as absent
        ("/log?token=&kind=entry", {"Cookie": f"durable_log_token={TOKEN}"}),
        ("/", {"X-Durable-Log-Token": "", "Cookie": f"durable_log_token={TOKEN}"}),
        ("/", {"Authorization": "Bearer ", "Cookie": f"durable_log_token={TOKEN}"}),
        ("/?token=wrong", {"Cookie": f"durable_log_token={TOKEN}"}),
        ("/", {"Cookie": "durable_log_token="}),
    ],
)
def test_an_empty_or_wrong_token_is_refused_even_beside_a_good_cookie(
    served: Served, target: str, headers: dict[str, str]
) -> None:
    status, found = _raw(served, target, headers)
    assert status == 401 and "location" not in found


def test_the_cookie_alone_is_let_in(served: Served) -> None:
    assert _raw(served, "/log", {"Cookie": f"durable_log_token={TOKEN}"})[0] == 200


@pytest.mark.parametrize("target", ["/healthz?token=wrong", "/healthz?token="])
def test_the_probe_with_a_wrong_token_answers_without_handing_out_the_token(
    served: Served, target: str
) -> None:
    """The probe answers without the token, so a wrong one reaches it: its answer sets no
    cookie (the cookie holds the token itself) and says only the store's status."""

    status, found = _raw(served, target)
    assert status in (200, 503) and "set-cookie" not in found
    assert TOKEN not in str(found)


def test_the_right_token_on_the_probe_is_moved_into_the_cookie(served: Served) -> None:
    status, found = _raw(served, f"/healthz?token={TOKEN}")
    assert status == 303 and found["location"] == "/healthz"
    assert found["set-cookie"].startswith(f"durable_log_token={TOKEN};")
