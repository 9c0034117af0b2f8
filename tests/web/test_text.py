"""Agent strings drawn by the web view: any text at all comes out as escaped, encodable text that
says exactly what the agent stored (invisible characters as escapes), cut only past the limit."""

from __future__ import annotations

import html
import re

from hypothesis import given
from hypothesis import strategies as st
from pi_durable_lmdb.web.text import plain, visible

ANY_TEXT = st.text(
    st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)
)  # lone surrogates too
OURS = re.compile(r'<span class="(ctl|cut)"[^>]*>(.*?)</span>')


@given(ANY_TEXT)
def test_any_text_is_drawn_as_escaped_text_that_reads_back_as_it_was_stored(text: str) -> None:
    drawn = str(visible(text, limit=None))
    drawn.encode("utf-8")  # no lone surrogate reaches the page
    outside = OURS.sub("", drawn)
    assert (
        "<" not in outside and ">" not in outside and '"' not in outside
    )  # no markup of the agent's
    assert html.unescape(OURS.sub(lambda found: found.group(2), drawn)) == plain(text)


@given(ANY_TEXT)
def test_plain_keeps_what_is_visible_and_writes_the_rest_as_escapes(text: str) -> None:
    shown = plain(text)
    shown.encode("utf-8")
    assert all(char in "\n\t" or char.isprintable() or char == " " for char in shown)
    if text.isprintable():
        assert shown == text


@given(st.text(max_size=50), st.integers(min_value=0, max_value=60))
def test_a_long_value_is_cut_at_the_limit_and_says_how_much_is_left_out(
    text: str, limit: int
) -> None:
    drawn = str(visible(text, limit=limit))
    if len(text) > limit:
        assert f"{len(text) - limit:,} more characters not shown" in drawn
    else:
        assert "not shown" not in drawn
