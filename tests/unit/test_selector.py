"""Selector language: operators, SQL NULL semantics, headers, errors, and a differential property test."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.core.message import Message, MessageData, MessageRef
from tandem.core.selector import Selector, SelectorSyntaxError, compile_selector
from tandem.errors import ErrorCode, InvalidSelector

T, F, U = True, False, None  # U = UNKNOWN

# --------------------------------------------------------------------------- evaluation table

PROPS: dict[str, object] = {
    "s": "red",
    "s2": "red",
    "q": "it's",
    "i": 5,
    "j": 7,
    "z": 0,
    "neg": -7,
    "f": 2.5,
    "big": 10**30,
    "b": True,
    "bf": False,
    "raw": b"\x00\x01",
    "raw2": b"\x00\x01",
    "lst": [1, 2],
    "nil": None,
    "a.b": 1,
    "$x_1": 2,
    "pct": "50%",
    "under": "a_b",
    "nl": "a\nb",
}

EVAL_CASES: list[tuple[str, Any]] = [
    # comparisons on numbers, across int and float
    ("i = 5", T),
    ("i = 5.0", T),
    ("i <> 5", F),
    ("i <> 4", T),
    ("i < 6", T),
    ("i < 5", F),
    ("i > 4.9", T),
    ("i <= 5", T),
    ("i >= 5", T),
    ("i >= 5.1", F),
    ("f > i", F),
    ("f < i", T),
    ("5 = i", T),
    ("6 > i", T),
    ("4 >= i", F),
    ("4 < i", T),
    ("5 < i", F),
    ("5 <= i", T),
    ("6 <= i", F),
    ("5 <> i", F),
    ("i = j", F),
    ("big > i", T),
    ("big = 1000000000000000000000000000000", T),
    # strings: only = and <>, only with strings
    ("s = 'red'", T),
    ("s = 'Red'", F),
    ("s <> 'blue'", T),
    ("s = s2", T),
    ("q = 'it''s'", T),
    ("'' = ''", T),
    ("s < 'z'", U),
    ("s >= 'a'", U),
    ("s = 5", U),
    ("i = '5'", U),
    ("s <> 5", U),
    # booleans: only = and <>, only with booleans
    ("b = TRUE", T),
    ("b = true", T),
    ("b <> FALSE", T),
    ("bf = FALSE", T),
    ("b = 1", U),
    ("i = TRUE", U),
    ("b > FALSE", U),
    ("b = bf", F),
    ("b", T),
    ("bf", F),
    ("NOT b", F),
    ("TRUE", T),
    ("FALSE", F),
    ("i", U),  # a non-boolean identifier used as a condition
    ("s", U),
    # bytes: only = and <> with bytes
    ("raw = raw2", T),
    ("raw <> raw2", F),
    ("raw = 'x'", U),
    ("raw > raw2", U),
    ("raw IS NOT NULL", T),
    # values of unsupported types never compare
    ("lst = lst", U),
    ("lst IS NULL", F),
    # NULL: missing properties and explicit None
    ("missing = 1", U),
    ("missing <> 1", U),
    ("1 = missing", U),
    ("missing = missing", U),
    ("nil = 1", U),
    ("missing IS NULL", T),
    ("nil IS NULL", T),
    ("i IS NULL", F),
    ("missing IS NOT NULL", F),
    ("i IS NOT NULL", T),
    ("NOT missing = 1", U),
    ("missing", U),
    ("NOT missing", U),
    # AND / OR truth tables with UNKNOWN
    ("i = 5 AND j = 7", T),
    ("i = 5 AND j = 8", F),
    ("i = 5 AND missing = 1", U),
    ("missing = 1 AND i = 5", U),
    ("i = 4 AND missing = 1", F),
    ("missing = 1 AND i = 4", F),
    ("missing = 1 AND missing = 2", U),
    ("i = 5 OR missing = 1", T),
    ("missing = 1 OR i = 5", T),
    ("i = 4 OR missing = 1", U),
    ("missing = 1 OR i = 4", U),
    ("i = 4 OR j = 8", F),
    ("missing = 1 OR missing = 2", U),
    ("NOT (missing = 1 AND i = 4)", T),
    # chains of three or more
    ("i = 5 AND j = 7 AND s = 'red'", T),
    ("i = 5 AND j = 7 AND missing = 1", U),
    ("i = 5 AND missing = 1 AND j = 8", F),
    ("missing = 1 AND missing = 2 AND i = 5", U),
    ("i = 4 OR j = 8 OR s = 'x'", F),
    ("i = 4 OR missing = 1 OR j = 7", T),
    ("i = 4 OR missing = 1 OR j = 8", U),
    ("missing = 1 OR i = 5 OR missing = 2", T),
    ("NOT (missing = 1 OR i = 5)", F),
    # precedence: NOT > AND > OR, comparison binds tighter than NOT
    ("i = 5 OR i = 6 AND j = 8", T),  # i=5 OR (i=6 AND j=8)
    ("(i = 5 OR i = 6) AND j = 8", F),
    ("NOT i = 4 AND j = 7", T),  # (NOT i=4) AND j=7
    ("NOT (i = 4 AND j = 7)", T),
    ("NOT i = 5 OR j = 7", T),
    ("NOT (i = 5 OR j = 7)", F),
    ("NOT NOT i = 5", T),
    ("i = 4 AND j = 7 OR i = 5", T),  # (i=4 AND j=7) OR i=5
    ("i = 4 AND (j = 7 OR i = 5)", F),
    ("((i = 5))", T),
    # arithmetic and its precedence
    ("i + 1 = 6", T),
    ("i - 1 = 4", T),
    ("i * 2 = 10", T),
    ("i / 2 = 2", T),  # integer division
    ("neg / 2 = -3", T),  # truncates towards zero, like Java
    ("-7 / 2 = -3", T),
    ("7 / -2 = -3", T),
    ("-7 / -2 = 3", T),
    ("f * 2 = 5", T),
    ("i / 2.0 = 2.5", T),
    ("1 + 2 * 3 = 7", T),
    ("(1 + 2) * 3 = 9", T),
    ("10 - 4 - 3 = 3", T),  # left associative
    ("100 / 10 / 5 = 2", T),
    ("-i = -5", T),
    ("- -i = 5", T),
    ("+i = 5", T),
    ("-i * 2 = -10", T),
    ("2 * -i = -10", T),
    ("i - -1 = 6", T),
    ("i / 0 = 1", U),
    ("i / z > 0", U),
    ("f / 0.0 = 1", U),
    ("i + missing = 5", U),
    ("s + 1 = 1", U),
    ("-s = 1", U),
    ("+s = 's'", U),
    ("b + 1 = 2", U),
    ("big * 1.5 > 0", T),
    ("big * big * big * big * big * big * big * big * big * big * big * 1.5 > 0", U),  # int too big for float
    # literals
    ("i = 0x5", T),
    ("255 = 0xFF", T),
    ("255 = 0Xff", T),
    ("i = 05", T),
    ("8 = 010", T),  # octal, as in Java
    ("i = 5L", T),
    ("2500 = 2.5e3", T),
    ("2500 = 2.5E+3", T),
    ("0.025 = 2.5e-2", T),
    ("5000 = 5e3", T),
    ("0.5 = .5", T),
    ("5 = 5.", T),
    ("f = 2.5", T),
    # IN
    ("s IN ('red', 'blue')", T),
    ("s IN ('blue')", F),
    ("s NOT IN ('blue', 'green')", T),
    ("s NOT IN ('red')", F),
    ("missing IN ('red')", U),
    ("missing NOT IN ('red')", U),
    ("nil IN ('red')", U),
    ("i IN (1, 5, 9)", T),
    ("i IN (5.0)", T),
    ("i IN (-5, 4)", F),
    ("neg IN (-7)", T),
    ("neg IN (+7, -7)", T),
    ("i IN ('5')", U),  # every comparison is UNKNOWN
    ("i NOT IN ('5')", U),
    ("s IN ('blue', 1)", U),  # no match, one comparison UNKNOWN
    ("s IN ('red', 1)", T),
    ("b IN ('x')", U),
    ("q IN ('it''s')", T),
    ("S IN ('red')", U),  # identifiers are case-sensitive
    # LIKE
    ("s LIKE 'red'", T),
    ("s LIKE 're'", F),
    ("s LIKE 'r%'", T),
    ("s LIKE '%d'", T),
    ("s LIKE '%e%'", T),
    ("s LIKE '%x%'", F),
    ("s LIKE 'r_d'", T),
    ("s LIKE 'r_'", F),
    ("s LIKE '___'", T),
    ("s LIKE '%'", T),
    ("s LIKE '%%'", T),
    ("s LIKE 'R%'", F),
    ("s LIKE 'r%d%'", T),
    ("s LIKE '_e%'", T),
    ("s NOT LIKE 'b%'", T),
    ("s NOT LIKE 'r%'", F),
    ("missing LIKE '%'", U),
    ("missing NOT LIKE '%'", U),
    ("i LIKE '5'", U),
    ("nl LIKE 'a_b'", T),  # '_' matches a newline too
    ("nl LIKE 'a%'", T),
    ("q LIKE 'it''%'", T),
    ("s LIKE 'r.d'", F),  # regex metacharacters are literal
    ("'a.c' LIKE 'a.c'", T),
    ("'a+(c' LIKE 'a+(_'", T),
    ("pct LIKE '50\\%' ESCAPE '\\'", T),
    ("pct LIKE '5_\\%' ESCAPE '\\'", T),
    ("'505' LIKE '50\\%' ESCAPE '\\'", F),
    ("under LIKE 'a!_b' ESCAPE '!'", T),
    ("'axb' LIKE 'a!_b' ESCAPE '!'", F),
    ("'a!b' LIKE 'a!!b' ESCAPE '!'", T),
    ("'a%b' LIKE 'a%%b' ESCAPE '%'", T),  # the escape character may itself be a wildcard
    ("'axb' LIKE 'a%%b' ESCAPE '%'", F),
    ("'abc' LIKE 'a!bc' ESCAPE '!'", T),  # escaping an ordinary character keeps it
    ("s LIKE 'r%' ESCAPE '!'", T),
    ("pct LIKE '%!%' escape '!'", T),
    # BETWEEN
    ("i BETWEEN 1 AND 5", T),
    ("i BETWEEN 5 AND 9", T),
    ("i BETWEEN 6 AND 9", F),
    ("f BETWEEN 2 AND 3", T),
    ("i BETWEEN 4.5 AND 5.5", T),
    ("i NOT BETWEEN 1 AND 4", T),
    ("i NOT BETWEEN 1 AND 9", F),
    ("missing BETWEEN 1 AND 9", U),
    ("missing NOT BETWEEN 1 AND 9", U),
    ("s BETWEEN 1 AND 9", U),
    ("s BETWEEN 'a' AND 'z'", U),
    ("i BETWEEN missing AND 9", U),
    ("i BETWEEN missing AND 4", F),  # UNKNOWN AND FALSE
    ("i NOT BETWEEN missing AND 4", T),
    ("i BETWEEN j - 3 AND j", T),
    ("j BETWEEN i AND j", T),
    ("i BETWEEN i AND j", T),
    ("j BETWEEN i AND i", F),
    ("i BETWEEN 1 + 1 AND 2 * 3", T),
    ("i BETWEEN 1 AND 9 AND j = 7", T),  # the BETWEEN's AND is not the logical AND
    ("i BETWEEN 1 AND 3 OR j = 7", T),
    ("i BETWEEN 9 AND 1", F),
    # keywords are case-insensitive
    ("i = 5 and j = 7", T),
    ("i = 4 Or j = 7", T),
    ("not i = 4", T),
    ("s in ('red')", T),
    ("s not in ('red')", F),
    ("s like 'r%'", T),
    ("s nOt LiKe 'r%'", F),
    ("i between 1 and 9", T),
    ("i not between 1 and 9", F),
    ("missing is null", T),
    ("i Is NoT nUlL", T),
    ("b = True", T),
    ("bf = fAlSe", T),
    # identifier characters
    ("a.b = 1", T),
    ("$x_1 = 2", T),
    # whitespace
    ("\ti\n=\r\n5\f", T),
    ("i=5AND j=7".replace("AND", " AND "), T),
    ("(i=5)AND(j=7)", T),
]


@pytest.mark.parametrize(("text", "expected"), EVAL_CASES)
def test_evaluate(text: str, expected: bool | None) -> None:
    sel = compile_selector(text)
    result = sel.evaluate(PROPS)
    assert result is expected
    assert sel.text == text


@pytest.mark.parametrize(("text", "expected"), EVAL_CASES)
def test_matches_agrees_with_evaluate(text: str, expected: bool | None) -> None:
    """A message whose properties are PROPS matches exactly when the selector is TRUE."""
    props = {k: v for k, v in PROPS.items() if k != "big"}  # msgpack integers stop at 64 bits
    sel = compile_selector(text)
    matched = sel.matches(_ref(properties=props))
    assert matched is (sel.evaluate(props) is True)
    if "big" not in text:
        assert matched is (expected is True)


# --------------------------------------------------------------------------- headers


def _message(
    mid: int = 42,
    address: str = "orders.eu",
    durable: bool = True,
    priority: int = 7,
    expiration: int = 0,
    timestamp: int = 1_700_000_000_000,
    properties: dict[str, Any] | None = None,
) -> Message:
    data = MessageData(
        address=address,
        durable=durable,
        priority=priority,
        expiration=expiration,
        timestamp=timestamp,
        properties=properties,
        body=b"x" * 10,
    )
    return Message.create(mid, data)


def _ref(**kwargs: Any) -> MessageRef:
    return MessageRef(_message(**kwargs), queue=None, seq=1)


HEADER_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("AMQPriority = 7", {}, True),
    ("JMSPriority = 7", {}, True),
    ("JMSPriority > 4", {"priority": 3}, False),
    ("AMQPriority BETWEEN 0 AND 9", {"priority": 42}, True),  # clamped to 9 by Message
    ("AMQTimestamp = 1700000000000", {}, True),
    ("JMSTimestamp > 1600000000000", {}, True),
    ("AMQExpiration = 0", {}, True),
    ("JMSExpiration > 0", {"expiration": 1_800_000_000_000}, True),
    ("JMSExpiration > 0", {}, False),
    ("AMQDurable = 'DURABLE'", {}, True),
    ("AMQDurable = 'NON_DURABLE'", {"durable": False}, True),
    ("AMQDurable = 'DURABLE'", {"durable": False}, False),
    ("JMSDeliveryMode = 'PERSISTENT'", {}, True),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", {"durable": False}, True),
    ("JMSDeliveryMode = 'DURABLE'", {}, False),
    ("AMQMessageID = 42", {}, True),
    ("AMQMessageID = '42'", {}, False),  # an int, so a string never equals it
    ("JMSMessageID = 'ID:42'", {}, True),
    ("JMSMessageID LIKE 'ID:%'", {"mid": 9}, True),
    ("AMQAddress = 'orders.eu'", {}, True),
    ("AMQAddress LIKE 'orders.%'", {}, True),
    ("AMQAddress LIKE 'invoices.%'", {}, False),
    ("AMQSize > 10", {}, True),
    ("AMQSize IS NOT NULL", {}, True),
    # properties
    ("color = 'red'", {"properties": {"color": "red"}}, True),
    ("color = 'red'", {"properties": None}, False),
    ("color IS NULL", {"properties": None}, True),
    ("color IS NULL", {"properties": {}}, True),
    ("NOT color = 'red'", {"properties": None}, False),  # UNKNOWN is not a match either way
    ("color = 'red' AND weight > 5", {"properties": {"color": "red", "weight": 6}}, True),
    ("color = 'red' AND weight > 5", {"properties": {"color": "red", "weight": 5.5}}, True),
    ("color = 'red' AND weight > 5", {"properties": {"color": "red", "weight": "6"}}, False),
    ("tag = 'x'", {"properties": {"tag": b"x"}}, False),  # bytes stay bytes through msgpack
    ("flag", {"properties": {"flag": True}}, True),
    ("NOT flag", {"properties": {"flag": False}}, True),
    ("n IS NULL", {"properties": {"n": None}}, True),
    # headers shadow properties; header names are case-sensitive
    ("AMQPriority = 1", {"properties": {"AMQPriority": 1}}, False),
    ("amqpriority = 1", {"properties": {"amqpriority": 1}}, True),
    ("JMSType = 'x'", {"properties": {"JMSType": "x"}}, True),  # not a header here: a property
]


@pytest.mark.parametrize(("text", "message", "expected"), HEADER_CASES)
def test_headers_and_properties(text: str, message: dict[str, Any], expected: bool) -> None:
    ref = _ref(**message)
    sel = compile_selector(text)
    assert sel.matches(ref) is expected
    assert sel.matches_message(ref.message) is expected


def test_headers_are_not_special_in_evaluate() -> None:
    """evaluate() takes plain identifier -> value pairs; header names are just keys there."""
    assert compile_selector("JMSPriority = 7").evaluate({"JMSPriority": 7}) is True
    assert compile_selector("JMSPriority = 7").evaluate({}) is None


def test_evaluate_accepts_int_and_str_subclasses() -> None:
    class Level(int):
        pass

    class Name(str):
        pass

    sel = compile_selector("level > 2 AND name = 'n' AND level IN (3) AND name LIKE 'n%' AND level BETWEEN 1 AND 3")
    assert sel.evaluate({"level": Level(3), "name": Name("n")}) is True


def test_long_chains_do_not_nest() -> None:
    """Generated selectors like `id = 1 OR id = 2 OR ...` can be long; they must neither fail nor recurse."""
    any_of = compile_selector(" OR ".join(f"id = {i}" for i in range(5000)))
    assert any_of.evaluate({"id": 4999}) is True
    assert any_of.evaluate({"id": -1}) is False
    assert any_of.evaluate({}) is None
    none_of = compile_selector(" AND ".join(f"id <> {i}" for i in range(5000)))
    assert none_of.evaluate({"id": -1}) is True
    assert none_of.evaluate({"id": 0}) is False


def test_nesting_limits() -> None:
    assert compile_selector("(" * 50 + "x = 1" + ")" * 50).evaluate({"x": 1}) is True
    assert compile_selector("NOT " * 50 + "x").evaluate({"x": True}) is True
    assert compile_selector("x" + " + x" * 90 + " = 91").evaluate({"x": 1}) is True
    with pytest.raises(InvalidSelector, match="nested more than 100 levels deep"):
        compile_selector("x" + " + x" * 100 + " = 1")


# --------------------------------------------------------------------------- API


def test_selector_object() -> None:
    sel = compile_selector("x = 1")
    assert isinstance(sel, Selector)
    assert sel.text == "x = 1"
    assert repr(sel) == "Selector('x = 1')"
    assert sel == Selector("x = 1")
    assert hash(sel) == hash(Selector("x = 1"))
    assert sel != compile_selector("x = 2")
    assert compile_selector("x = 1") is sel  # cached by text


def test_error_type_and_code() -> None:
    with pytest.raises(InvalidSelector) as info:
        compile_selector("x = ")
    err = info.value
    assert isinstance(err, SelectorSyntaxError)
    assert err.code is ErrorCode.INVALID_SELECTOR
    assert err.position == 5
    assert err.selector == "x = "
    assert err.message == ("selector error at position 5: expected an expression but found end of input in: x = ")
    assert str(err).startswith("[INVALID_SELECTOR] selector error at position 5")


def test_error_message_for_unclosed_parenthesis() -> None:
    text = "color = 'red' AND (x > 1"
    with pytest.raises(InvalidSelector) as info:
        compile_selector(text)
    assert info.value.message == (
        f"selector error at position 25: expected ')' to match '(' at position 19 but found end of input in: {text}"
    )


# --------------------------------------------------------------------------- invalid selectors

INVALID_CASES: list[tuple[str, int, str]] = [
    ("", 1, "selector is empty"),
    ("   ", 1, "selector is empty"),
    ("\n\t", 1, "selector is empty"),
    ("x = 'abc", 5, "unterminated string literal"),
    ("x = 'it''s", 5, "unterminated string literal"),
    ("x = 'a''", 5, "unterminated string literal"),
    ("x = 1 AND y ! 2", 13, "unexpected character '!'"),
    ("x != 1", 3, "unexpected character '!'"),
    ('x = "a"', 5, "unexpected character '\"'"),
    ("x = 1;", 6, "unexpected character ';'"),
    ("x = 1 y", 7, "expected AND, OR or end of input but found identifier 'y'"),
    ("x = 1 2", 7, "expected AND, OR or end of input but found number 2"),
    ("x = 1)", 6, "expected AND, OR or end of input but found ')'"),
    ("x = 1 = 2", 7, "expected AND, OR or end of input but found '='"),
    ("x = 1 IS NULL", 7, "found keyword IS"),
    ("x y", 3, "expected an operator but found identifier 'y'"),
    ("x =", 4, "expected an expression but found end of input"),
    ("x = AND y = 1", 5, "expected an expression but found keyword AND"),
    ("x = 1 AND", 10, "expected an expression but found end of input"),
    ("x = 1 AND OR y = 1", 11, "expected an expression but found keyword OR"),
    ("AND x = 1", 1, "expected an expression but found keyword AND"),
    ("NOT", 4, "expected an expression but found end of input"),
    ("x + = 1", 5, "expected an expression but found '='"),
    ("x * * 2 = 1", 5, "expected an expression but found '*'"),
    ("()", 2, "expected an expression but found ')'"),
    ("x = NULL", 5, "found keyword NULL (compare with IS NULL or IS NOT NULL)"),
    ("x = 1 AND (y = 2", 17, "expected ')' to match '(' at position 11 but found end of input"),
    ("((x = 1)", 9, "expected ')' to match '(' at position 1 but found end of input"),
    ("(x = 1 y", 8, "expected ')' to match '(' at position 1 but found identifier 'y'"),
    ("x IN 'a'", 6, "expected '(' after IN but found string 'a'"),
    ("x IN ()", 7, "expected a string or number literal but found ')'"),
    ("x IN ('a',)", 11, "expected a string or number literal but found ')'"),
    ("x IN ('a' 'b')", 11, "expected ')' to match '(' at position 6 but found string 'b'"),
    ("x IN ('a'", 10, "expected ')' to match '(' at position 6 but found end of input"),
    ("x IN (y)", 7, "expected a string or number literal but found identifier 'y'"),
    ("x IN (-'a')", 8, "expected a number but found string 'a'"),
    ("x NOT = 1", 7, "expected IN, LIKE or BETWEEN after NOT but found '='"),
    ("x NOT NULL", 7, "expected IN, LIKE or BETWEEN after NOT but found keyword NULL"),
    ("x LIKE y", 8, "expected a string pattern after LIKE but found identifier 'y'"),
    ("x LIKE", 7, "expected a string pattern after LIKE but found end of input"),
    ("x LIKE 'a' ESCAPE 'ab'", 19, "expected a one-character string after ESCAPE but found string 'ab'"),
    ("x LIKE 'a' ESCAPE ''", 19, "expected a one-character string after ESCAPE but found string ''"),
    ("x LIKE 'a' ESCAPE", 18, "expected a one-character string after ESCAPE but found end of input"),
    ("x LIKE 'a' ESCAPE 1", 19, "expected a one-character string after ESCAPE but found number 1"),
    ("x LIKE 'a!' ESCAPE '!'", 8, "LIKE pattern ends with its escape character '!'"),
    ("x BETWEEN 1", 12, "expected AND but found end of input"),
    ("x BETWEEN 1 OR 2", 13, "expected AND but found keyword OR"),
    ("x BETWEEN AND 2", 11, "expected an expression but found keyword AND"),
    ("x IS 1", 6, "expected NULL but found number 1"),
    ("x IS NOT", 9, "expected NULL but found end of input"),
    ("x = 1.5e", 5, "malformed number 1.5e"),
    ("x = 12abc", 5, "malformed number 12abc"),
    ("x = 0x", 5, "malformed number 0x"),
    ("x = 1.2.3", 5, "malformed number 1.2.3"),
    ("x = 09", 5, "invalid octal number 09"),
    ("x = 1.5L", 5, "malformed number 1.5L"),
    ("x = .", 5, "unexpected character '.'"),
    # a condition is needed where TRUE/FALSE/UNKNOWN is
    ("x + 1", 1, "expected a condition but found a numeric expression"),
    ("5", 1, "expected a condition but found a numeric expression"),
    ("'red'", 1, "expected a condition but found a string"),
    ("NOT 5", 5, "expected a condition but found a numeric expression"),
    ("x = 1 AND 'a'", 11, "expected a condition but found a string"),
    ("-x OR y = 1", 1, "expected a condition but found a numeric expression"),
    ("(1 + 2)", 2, "expected a condition but found a numeric expression"),
    # keywords are not identifiers
    ("and = 1", 1, "expected an expression but found keyword AND"),
    ("x = in", 5, "expected an expression but found keyword IN"),
    ("escape = 1", 1, "expected an expression but found keyword ESCAPE"),
    # nesting is bounded so that neither parsing nor evaluation can exhaust the stack
    ("(" * 51 + "x = 1" + ")" * 51, 51, "selector is nested more than 50 levels deep"),
    ("NOT " * 51 + "x", 201, "selector is nested more than 50 levels deep"),
    ("-" * 51 + "x = 1", 51, "selector is nested more than 50 levels deep"),
]


@pytest.mark.parametrize(("text", "position", "fragment"), INVALID_CASES)
def test_invalid_selector(text: str, position: int, fragment: str) -> None:
    with pytest.raises(InvalidSelector) as info:
        compile_selector(text)
    message = info.value.message
    match = re.match(r"selector error at position (\d+): (.*) in: (.*)\Z", message, re.DOTALL)
    assert match is not None, message
    assert int(match.group(1)) == position, message
    assert fragment in match.group(2), message
    assert match.group(3) == text
    assert isinstance(info.value, SelectorSyntaxError)
    assert info.value.position == position


# --------------------------------------------------------------------------- differential property test
#
# Random expression trees are rendered to selector text with as few parentheses as SQL precedence
# allows, then the compiled selector is checked against the tiny reference evaluator below.


@dataclass(frozen=True)
class Ident:
    name: str


@dataclass(frozen=True)
class Lit:
    value: int | str


@dataclass(frozen=True)
class Arith:
    op: str  # + - *
    left: Value
    right: Value


Value = Ident | Lit | Arith


@dataclass(frozen=True)
class Cmp:
    op: str
    left: Value
    right: Value


@dataclass(frozen=True)
class In:
    operand: Ident
    items: tuple[int | str, ...]
    negated: bool


@dataclass(frozen=True)
class Between:
    operand: Value
    low: Value
    high: Value
    negated: bool


@dataclass(frozen=True)
class IsNull:
    operand: Ident
    negated: bool


@dataclass(frozen=True)
class BoolLit:
    value: bool


@dataclass(frozen=True)
class Not:
    operand: Cond


@dataclass(frozen=True)
class And:
    left: Cond
    right: Cond


@dataclass(frozen=True)
class Or:
    left: Cond
    right: Cond


Cond = Cmp | In | Between | IsNull | BoolLit | Not | And | Or

NAMES = ("a", "b", "c", "d")
ints = st.integers(min_value=-1, max_value=2)
strs = st.sampled_from(["", "x", "y", "it's", "X"])
scalars: st.SearchStrategy[int | str] = st.one_of(ints, ints, strs)

values_st: st.SearchStrategy[Value] = st.recursive(
    st.one_of(st.builds(Ident, st.sampled_from(NAMES)), st.builds(Lit, scalars)),
    lambda inner: st.builds(Arith, st.sampled_from(["+", "-", "*"]), inner, inner),
    max_leaves=3,
)
predicates: st.SearchStrategy[Cond] = st.one_of(
    st.builds(Cmp, st.sampled_from(["=", "<>", "<", ">", "<=", ">="]), values_st, values_st),
    st.builds(
        In,
        st.builds(Ident, st.sampled_from(NAMES)),
        st.lists(scalars, min_size=1, max_size=3).map(tuple),
        st.booleans(),
    ),
    st.builds(Between, values_st, values_st, values_st, st.booleans()),
    st.builds(IsNull, st.builds(Ident, st.sampled_from(NAMES)), st.booleans()),
)
conditions: st.SearchStrategy[Cond] = st.recursive(
    st.one_of(predicates, st.builds(BoolLit, st.booleans())),
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.builds(And, inner, inner),
        st.builds(Or, inner, inner),
    ),
    max_leaves=8,
)
# Mostly ints so that comparisons and arithmetic often have a definite answer. A property is NULL
# either by being absent or by holding None.
MISSING = object()
env_values = st.one_of(ints, ints, ints, strs, st.none(), st.just(MISSING))
Env = dict[str, int | str | None]
environments: st.SearchStrategy[Env] = st.fixed_dictionaries(dict.fromkeys(NAMES, env_values)).map(
    lambda d: {k: v for k, v in d.items() if v is not MISSING}
)


# -- rendering


def render_lit(v: int | str) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return str(v)


def value_prec(v: Value) -> int:
    if isinstance(v, Arith):
        return 2 if v.op == "*" else 1
    return 3


def render_value(v: Value) -> str:
    if isinstance(v, Ident):
        return v.name
    if isinstance(v, Lit):
        return render_lit(v.value)
    prec = value_prec(v)
    left = render_value(v.left)
    right = render_value(v.right)
    if value_prec(v.left) < prec:
        left = f"({left})"
    if value_prec(v.right) <= prec:  # left associative: a - (b - c) needs its parentheses
        right = f"({right})"
    return f"{left} {v.op} {right}"


def cond_prec(c: Cond) -> int:
    if isinstance(c, Or):
        return 1
    if isinstance(c, And):
        return 2
    if isinstance(c, Not):
        return 3
    return 4


def render(c: Cond, kw: Callable[[str], str]) -> str:
    if isinstance(c, Cmp):
        return f"{render_value(c.left)} {c.op} {render_value(c.right)}"
    if isinstance(c, In):
        items = ", ".join(render_lit(i) for i in c.items)
        return f"{c.operand.name} {kw('NOT ') if c.negated else ''}{kw('IN')} ({items})"
    if isinstance(c, Between):
        neg = kw("NOT ") if c.negated else ""
        return (
            f"{render_value(c.operand)} {neg}{kw('BETWEEN')} {render_value(c.low)} {kw('AND')} {render_value(c.high)}"
        )
    if isinstance(c, IsNull):
        return f"{c.operand.name} {kw('IS')} {kw('NOT ') if c.negated else ''}{kw('NULL')}"
    if isinstance(c, BoolLit):
        return kw("TRUE" if c.value else "FALSE")
    if isinstance(c, Not):
        inner = render(c.operand, kw)
        return f"{kw('NOT')} {f'({inner})' if cond_prec(c.operand) < 3 else inner}"
    prec = cond_prec(c)
    left = render(c.left, kw)
    right = render(c.right, kw)
    if cond_prec(c.left) < prec:
        left = f"({left})"
    if cond_prec(c.right) <= prec:
        right = f"({right})"
    return f"{left} {kw('AND' if isinstance(c, And) else 'OR')} {right}"


# -- reference evaluator (explicit SQL truth tables)

NOT_TABLE = {T: F, F: T, U: U}
AND_TABLE = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
OR_TABLE = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip


def ref_value(v: Value, env: Env) -> int | str | None:
    if isinstance(v, Ident):
        return env.get(v.name)
    if isinstance(v, Lit):
        return v.value
    a, b = ref_value(v.left, env), ref_value(v.right, env)
    if not isinstance(a, int) or not isinstance(b, int):
        return None
    return a + b if v.op == "+" else a - b if v.op == "-" else a * b


def ref_compare(op: str, a: int | str | None, b: int | str | None) -> bool | None:
    if a is None or b is None or type(a) is not type(b):
        return U
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if isinstance(a, str):
        return U  # strings only compare for (in)equality
    assert isinstance(b, int)
    return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]


def ref_eval(c: Cond, env: Env) -> bool | None:
    if isinstance(c, Cmp):
        return ref_compare(c.op, ref_value(c.left, env), ref_value(c.right, env))
    if isinstance(c, In):
        v = ref_value(c.operand, env)
        results = [ref_compare("=", v, item) for item in c.items]
        r = T if T in results else U if U in results else F
        return NOT_TABLE[r] if c.negated else r
    if isinstance(c, Between):
        v = ref_value(c.operand, env)
        low = ref_compare(">=", v, ref_value(c.low, env))
        high = ref_compare("<=", v, ref_value(c.high, env))
        r = AND_TABLE[low, high]
        return NOT_TABLE[r] if c.negated else r
    if isinstance(c, IsNull):
        return (ref_value(c.operand, env) is None) is not c.negated
    if isinstance(c, BoolLit):
        return c.value
    if isinstance(c, Not):
        return NOT_TABLE[ref_eval(c.operand, env)]
    if isinstance(c, And):
        return AND_TABLE[ref_eval(c.left, env), ref_eval(c.right, env)]
    return OR_TABLE[ref_eval(c.left, env), ref_eval(c.right, env)]


KEYWORD_CASES: list[Callable[[str], str]] = [str.upper, str.lower, str.title]


def check_against_reference(cond: Cond, env: Env, kw: Callable[[str], str]) -> None:
    text = render(cond, kw)
    expected = ref_eval(cond, env)
    sel = Selector(text)  # bypass the cache so each example really parses
    assert sel.evaluate(env) is expected, text
    assert sel.matches(_ref(properties=dict(env))) is (expected is True), text


@settings(max_examples=300, deadline=None)
@given(conditions, environments, st.sampled_from(KEYWORD_CASES))
def test_conditions_match_reference_evaluator(cond: Cond, env: Env, kw: Callable[[str], str]) -> None:
    check_against_reference(cond, env, kw)


@settings(max_examples=300, deadline=None)
@given(predicates, environments)
def test_predicates_match_reference_evaluator(cond: Cond, env: Env) -> None:
    """Single predicates, where no AND/OR can mask a wrong answer."""
    check_against_reference(cond, env, str.upper)
