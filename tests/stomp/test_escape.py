"""escape_header_value / unescape_header_value, by table and by property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.stomp import BadHeaderEscape, escape_header_value, unescape_header_value


@pytest.mark.parametrize(
    ("version", "plain", "escaped"),
    [
        ("1.2", "a\rb", "a\\rb"),
        ("1.2", "a\nb", "a\\nb"),
        ("1.2", "a:b", "a\\cb"),
        ("1.2", "a\\b", "a\\\\b"),
        ("1.2", "\\n", "\\\\n"),  # a backslash followed by n, not a newline
        ("1.2", "plain /queue/a", "plain /queue/a"),
        ("1.1", "a\nb", "a\\nb"),
        ("1.1", "a:b", "a\\cb"),
        ("1.1", "a\\b", "a\\\\b"),
        ("1.1", "a\rb", "a\rb"),  # 1.1 has no escape for CR
        ("1.0", "a\nb:c\\d\re", "a\nb:c\\d\re"),
    ],
)
def test_escape_table(version: str, plain: str, escaped: str) -> None:
    assert escape_header_value(plain, version) == escaped
    assert unescape_header_value(escaped, version) == plain


@pytest.mark.parametrize(
    ("version", "value", "sequence"),
    [
        ("1.2", "\\t", "\\t"),
        ("1.2", "abc\\", "\\"),
        ("1.2", "\\\\\\", "\\"),  # an escaped backslash, then a lone one
        ("1.2", "\\ ", "\\ "),
        ("1.1", "\\r", "\\r"),
    ],
)
def test_undefined_escapes_raise(version: str, value: str, sequence: str) -> None:
    with pytest.raises(BadHeaderEscape) as info:
        unescape_header_value(value, version)
    assert info.value.sequence == sequence


def test_1_0_has_no_escapes_to_get_wrong() -> None:
    assert unescape_header_value("\\t\\", "1.0") == "\\t\\"


@pytest.mark.parametrize("version", ["", "1.3"])
def test_unknown_version(version: str) -> None:
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        escape_header_value("x", version)
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        unescape_header_value("x", version)


@given(st.text(), st.sampled_from(["1.0", "1.1", "1.2"]))
def test_unescape_inverts_escape(value: str, version: str) -> None:
    assert unescape_header_value(escape_header_value(value, version), version) == value


@given(st.text())
def test_1_2_escaped_values_fit_on_one_header_line(value: str) -> None:
    escaped = escape_header_value(value, "1.2")
    assert not {"\r", "\n", ":"} & set(escaped)


@given(st.text(alphabet=st.sampled_from("\\nrct:a\n")), st.sampled_from(["1.1", "1.2"]))
def test_unescape_either_succeeds_or_raises_bad_header_escape(value: str, version: str) -> None:
    try:
        plain = unescape_header_value(value, version)
    except BadHeaderEscape as error:
        assert error.sequence.startswith("\\")
    else:
        if "\\" not in value:
            assert plain == value
        assert unescape_header_value(escape_header_value(plain, version), version) == plain
