"""Message selectors: the SQL-92 subset that JMS and Artemis use to filter messages.

A selector such as ``color = 'red' AND weight > 5`` is parsed once by a small
recursive-descent parser into a tree of nodes. Each node then compiles into a
closure, so matching a message is a handful of plain Python calls and never
touches the text again: filters run once per message per consumer.

Semantics follow JMS:

* SQL three-valued logic. A missing property is NULL; any comparison or
  arithmetic with NULL is UNKNOWN (``None`` here), ``NOT UNKNOWN`` is UNKNOWN,
  AND/OR follow the SQL truth tables, and a message matches only when the whole
  selector is TRUE.
* Type rules: numbers compare numerically across int and float; strings,
  booleans and bytes only with ``=`` and ``<>`` and only with their own type.
  Any other combination (a string against a number, ``'a' < 'b'``, arithmetic
  on a string, division by zero) is UNKNOWN rather than an error, so a bad
  property value in one message never breaks delivery.
* Integer arithmetic truncates like Java (``-7 / 2`` is ``-3``); a literal with a
  leading zero is octal and ``0x`` hexadecimal, as in Java and Artemis.

The tree compiles against an *environment* that turns an identifier into an
accessor. :meth:`Selector.evaluate` uses a plain mapping; :meth:`Selector.matches`
reads message headers (``AMQPriority``/``JMSPriority`` ...) first and then the
message's properties. Both share every other part of the evaluator.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple, NoReturn

from ..errors import InvalidSelector

if TYPE_CHECKING:
    from .message import Message, MessageRef

__all__ = ["Selector", "SelectorSyntaxError", "compile_selector"]

Fn = Callable[[Any], object]
"""A compiled node: context (mapping or message) -> value, or True/False/None for conditions."""
Env = Callable[[str], Fn]
"""Turns an identifier into an accessor over the context."""


class SelectorSyntaxError(InvalidSelector):
    """An InvalidSelector that also carries the 1-based position of the problem."""

    def __init__(self, message: str = "", position: int = 0, selector: str = "") -> None:
        super().__init__(message)
        self.position = position
        self.selector = selector


# --------------------------------------------------------------------------- runtime value rules

# Runtime kinds of a value. bool is its own kind although it subclasses int.
_K_NULL: Final = 0
_K_NUM: Final = 1
_K_STR: Final = 2
_K_BOOL: Final = 3
_K_BYTES: Final = 4
_K_OTHER: Final = 5

_KIND_BY_TYPE: Final[dict[type, int]] = {
    type(None): _K_NULL,
    int: _K_NUM,
    float: _K_NUM,
    str: _K_STR,
    bool: _K_BOOL,
    bytes: _K_BYTES,
}
_NUM_TYPES: Final = frozenset((int, float))


def _kind(v: object) -> int:
    """Classify a value; exact types hit the dict, subclasses (IntEnum, ...) take the slow path."""
    k = _KIND_BY_TYPE.get(type(v))
    if k is not None:
        return k
    if isinstance(v, int | float):
        return _K_NUM
    if isinstance(v, str):
        return _K_STR
    if isinstance(v, bytes | bytearray | memoryview):
        return _K_BYTES
    return _K_OTHER


def _not3(v: bool | None) -> bool | None:
    return None if v is None else not v


def _and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _equal(a: object, b: object) -> bool | None:
    """JMS ``=``: only values of the same kind compare; anything else is UNKNOWN."""
    ka = _kind(a)
    if ka == _K_NULL or ka == _K_OTHER or ka != _kind(b):
        return None
    return bool(a == b)


def _order(cmp: Callable[[Any, Any], bool], a: object, b: object) -> bool | None:
    """JMS ``< > <= >=``: numbers only."""
    if _kind(a) == _K_NUM and _kind(b) == _K_NUM:
        return cmp(a, b)
    return None


_ORDER_OPS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}
_FLIPPED: Final = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _divide(a: Any, b: Any) -> object:
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)  # Java truncates towards zero; Python's // floors
        return q if (a < 0) == (b < 0) else -q
    return a / b


_ARITH_OPS: Final[dict[str, Callable[[Any, Any], object]]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
}


def _arith(op: Callable[[Any, Any], object], a: object, b: object) -> object:
    if _kind(a) != _K_NUM or _kind(b) != _K_NUM:
        return None
    try:
        return op(a, b)
    except OverflowError:  # an int too large for a float in mixed arithmetic
        return None


# --------------------------------------------------------------------------- tree

_C_BOOL: Final = "condition"
_C_NUM: Final = "numeric expression"
_C_STR: Final = "string"
_C_ANY: Final = "value"  # an identifier: could hold anything, including a boolean


def _const(value: object) -> Fn:
    return lambda ctx: value


class _Node:
    """A parsed selector element; `kind` is its static type, used to reject `x + 1` as a condition."""

    kind: str = _C_BOOL

    def __init__(self, pos: int) -> None:
        self.pos = pos

    def children(self) -> tuple[_Node, ...]:
        return ()

    def compile(self, env: Env) -> Fn:
        raise NotImplementedError


class _Literal(_Node):
    def __init__(self, pos: int, value: object, kind: str) -> None:
        super().__init__(pos)
        self.value = value
        self.kind = kind

    def compile(self, env: Env) -> Fn:
        return _const(self.value)


class _Ident(_Node):
    kind = _C_ANY

    def __init__(self, pos: int, name: str) -> None:
        super().__init__(pos)
        self.name = name

    def compile(self, env: Env) -> Fn:
        return env(self.name)


class _AsCondition(_Node):
    """An identifier used as a condition: TRUE/FALSE if it holds a boolean, else UNKNOWN."""

    def __init__(self, operand: _Node) -> None:
        super().__init__(operand.pos)
        self.operand = operand

    def children(self) -> tuple[_Node, ...]:
        return (self.operand,)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)

        def as_condition(ctx: Any) -> object:
            v = f(ctx)
            return v if type(v) is bool else None

        return as_condition


class _Negate(_Node):
    kind = _C_NUM

    def __init__(self, pos: int, operand: _Node) -> None:
        super().__init__(pos)
        self.operand = operand

    def children(self) -> tuple[_Node, ...]:
        return (self.operand,)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)

        def negate(ctx: Any) -> object:
            v: Any = f(ctx)
            return -v if _kind(v) == _K_NUM else None

        return negate


class _Plus(_Negate):
    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)

        def plus(ctx: Any) -> object:
            v = f(ctx)
            return v if _kind(v) == _K_NUM else None

        return plus


class _Arith(_Node):
    kind = _C_NUM

    def __init__(self, op: str, left: _Node, right: _Node) -> None:
        super().__init__(left.pos)
        self.op = op
        self.left = left
        self.right = right

    def children(self) -> tuple[_Node, ...]:
        return (self.left, self.right)

    def compile(self, env: Env) -> Fn:
        lf = self.left.compile(env)
        rf = self.right.compile(env)
        op = _ARITH_OPS[self.op]

        def arith(ctx: Any) -> object:
            return _arith(op, lf(ctx), rf(ctx))

        return arith


class _Compare(_Node):
    def __init__(self, op: str, left: _Node, right: _Node) -> None:
        super().__init__(left.pos)
        if isinstance(left, _Literal) and not isinstance(right, _Literal):
            left, right, op = right, left, _FLIPPED[op]  # constant on the right: see _compare_const
        self.op = op
        self.left = left
        self.right = right

    def children(self) -> tuple[_Node, ...]:
        return (self.left, self.right)

    def compile(self, env: Env) -> Fn:
        lf = self.left.compile(env)
        if isinstance(self.right, _Literal):
            return _compare_const(self.op, lf, self.right.value)
        rf = self.right.compile(env)
        if self.op == "=":
            return lambda ctx: _equal(lf(ctx), rf(ctx))
        if self.op == "<>":
            return lambda ctx: _not3(_equal(lf(ctx), rf(ctx)))
        cmp = _ORDER_OPS[self.op]
        return lambda ctx: _order(cmp, lf(ctx), rf(ctx))


def _compare_const(op: str, lf: Fn, c: Any) -> Fn:
    """Specialise `expr <op> literal`, the common case: one type test, then a native comparison."""
    k = _kind(c)
    if k == _K_NULL:
        return _const(None)
    if op == "=" or op == "<>":
        fast = _NUM_TYPES if k == _K_NUM else frozenset((type(c),))
        if op == "=":

            def eq(ctx: Any) -> object:
                v = lf(ctx)
                if type(v) in fast:
                    return v == c
                return _equal(v, c)

            return eq

        def ne(ctx: Any) -> object:
            v = lf(ctx)
            if type(v) in fast:
                return v != c
            return _not3(_equal(v, c))

        return ne
    if k != _K_NUM:
        return _const(None)
    cmp = _ORDER_OPS[op]

    def order(ctx: Any) -> object:
        v = lf(ctx)
        if type(v) in _NUM_TYPES:
            return cmp(v, c)
        return _order(cmp, v, c)

    return order


class _Not(_Node):
    def __init__(self, pos: int, operand: _Node) -> None:
        super().__init__(pos)
        self.operand = operand

    def children(self) -> tuple[_Node, ...]:
        return (self.operand,)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)

        def not_(ctx: Any) -> object:
            v = f(ctx)
            return None if v is None else not v

        return not_


class _And(_Node):
    """A chain ``a AND b AND ...`` as one node, so long generated selectors do not nest deeply."""

    def __init__(self, operands: list[_Node]) -> None:
        super().__init__(operands[0].pos)
        self.operands = operands

    def children(self) -> tuple[_Node, ...]:
        return tuple(self.operands)

    def compile(self, env: Env) -> Fn:
        fns = tuple(op.compile(env) for op in self.operands)
        if len(fns) == 2:
            lf, rf = fns

            def and2(ctx: Any) -> object:
                a = lf(ctx)
                if a is False:
                    return False
                b = rf(ctx)
                if a is True or b is False:
                    return b
                return None  # UNKNOWN AND (TRUE or UNKNOWN)

            return and2

        def and_n(ctx: Any) -> object:
            result: bool | None = True
            for f in fns:
                v = f(ctx)
                if v is False:
                    return False
                if v is None:
                    result = None
            return result

        return and_n


class _Or(_And):
    def compile(self, env: Env) -> Fn:
        fns = tuple(op.compile(env) for op in self.operands)
        if len(fns) == 2:
            lf, rf = fns

            def or2(ctx: Any) -> object:
                a = lf(ctx)
                if a is True:
                    return True
                b = rf(ctx)
                if a is False or b is True:
                    return b
                return None  # UNKNOWN OR (FALSE or UNKNOWN)

            return or2

        def or_n(ctx: Any) -> object:
            result: bool | None = False
            for f in fns:
                v = f(ctx)
                if v is True:
                    return True
                if v is None:
                    result = None
            return result

        return or_n


class _In(_Node):
    """``x IN (...)``: a disjunction of ``x = item``, answered with set lookups."""

    def __init__(self, operand: _Node, items: list[object], negated: bool) -> None:
        super().__init__(operand.pos)
        self.operand = operand
        self.items = items
        self.negated = negated

    def children(self) -> tuple[_Node, ...]:
        return (self.operand,)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)
        by_kind: dict[int, frozenset[object]] = {}
        for item in self.items:
            k = _kind(item)
            by_kind[k] = by_kind.get(k, frozenset()) | {item}
        mixed = len(by_kind) > 1
        negated = self.negated

        def in_(ctx: Any) -> object:
            v = f(ctx)
            k = _kind(v)
            same = by_kind.get(k)
            if same is not None and v in same:
                r: bool | None = True
            elif k == _K_NULL or k == _K_OTHER or mixed or same is None:
                r = None  # some `v = item` was UNKNOWN and none was TRUE
            else:
                r = False
            return _not3(r) if negated else r

        return in_


class _Like(_Node):
    def __init__(self, operand: _Node, matcher: Callable[[str], bool], negated: bool) -> None:
        super().__init__(operand.pos)
        self.operand = operand
        self.matcher = matcher
        self.negated = negated

    def children(self) -> tuple[_Node, ...]:
        return (self.operand,)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)
        matcher = self.matcher
        negated = self.negated

        def like(ctx: Any) -> object:
            v: Any = f(ctx)
            if type(v) is str or _kind(v) == _K_STR:
                return matcher(v) is not negated
            return None

        return like


_ANY_RUN: Final = object()  # '%'
_ONE_CHAR: Final = object()  # '_'


def _like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool] | None:
    """Turn a LIKE pattern into a predicate; None if the pattern ends with its escape character.

    Patterns that are a literal, a prefix, a suffix or a substring avoid regular expressions.
    """
    parts: list[object] = []
    literal: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                return None
            literal.append(nxt)
            continue
        if ch != "%" and ch != "_":
            literal.append(ch)
            continue
        if literal:
            parts.append("".join(literal))
            literal.clear()
        if ch == "_":
            parts.append(_ONE_CHAR)
        elif not parts or parts[-1] is not _ANY_RUN:  # '%%' is the same as '%'
            parts.append(_ANY_RUN)
    if literal:
        parts.append("".join(literal))

    if _ONE_CHAR not in parts:
        texts = [p for p in parts if isinstance(p, str)]
        if len(texts) <= 1:
            text = texts[0] if texts else ""
            starts = bool(parts) and parts[0] is _ANY_RUN
            ends = bool(parts) and parts[-1] is _ANY_RUN
            if starts and ends:
                return lambda s: text in s
            if starts:
                return lambda s: s.endswith(text)
            if ends:
                return lambda s: s.startswith(text)
            return lambda s: s == text
    regex = "".join(re.escape(p) if isinstance(p, str) else ".*" if p is _ANY_RUN else "." for p in parts)
    compiled = re.compile(regex, re.DOTALL)
    return lambda s: compiled.fullmatch(s) is not None


class _Between(_Node):
    def __init__(self, operand: _Node, low: _Node, high: _Node, negated: bool) -> None:
        super().__init__(operand.pos)
        self.operand = operand
        self.low = low
        self.high = high
        self.negated = negated

    def children(self) -> tuple[_Node, ...]:
        return (self.operand, self.low, self.high)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)
        negated = self.negated
        low, high = self.low, self.high
        if (
            isinstance(low, _Literal)
            and isinstance(high, _Literal)
            and _kind(low.value) == _K_NUM
            and _kind(high.value) == _K_NUM
        ):
            lo: Any = low.value
            hi: Any = high.value

            def between_const(ctx: Any) -> object:
                v: Any = f(ctx)
                if type(v) in _NUM_TYPES or _kind(v) == _K_NUM:
                    return (lo <= v <= hi) is not negated
                return None  # both comparisons UNKNOWN

            return between_const

        lof = low.compile(env)
        hif = high.compile(env)

        def between(ctx: Any) -> object:
            v = f(ctx)
            r = _and3(_order(operator.ge, v, lof(ctx)), _order(operator.le, v, hif(ctx)))
            return _not3(r) if negated else r

        return between


class _IsNull(_Node):
    def __init__(self, operand: _Node, negated: bool) -> None:
        super().__init__(operand.pos)
        self.operand = operand
        self.negated = negated

    def children(self) -> tuple[_Node, ...]:
        return (self.operand,)

    def compile(self, env: Env) -> Fn:
        f = self.operand.compile(env)
        if self.negated:
            return lambda ctx: f(ctx) is not None
        return lambda ctx: f(ctx) is None


def _no_env(name: str) -> Fn:
    raise AssertionError(f"constant folding reached identifier {name}")


def _fold(node: _Node) -> _Node:
    """Evaluate a node whose operands are all literals once, at compile time."""
    kids = node.children()
    if kids and all(isinstance(k, _Literal) for k in kids):
        return _Literal(node.pos, node.compile(_no_env)(None), node.kind)
    return node


# --------------------------------------------------------------------------- tokenizer

_T_IDENT: Final = "identifier"
_T_KEYWORD: Final = "keyword"
_T_STRING: Final = "string"
_T_NUMBER: Final = "number"
_T_OP: Final = "operator"
_T_END: Final = "end"

_KEYWORDS: Final = frozenset(("AND", "OR", "NOT", "IN", "LIKE", "ESCAPE", "BETWEEN", "IS", "NULL", "TRUE", "FALSE"))
_COMPARISONS: Final = frozenset(("=", "<>", "<", ">", "<=", ">="))
_TWO_CHAR_OPS: Final = frozenset(("<>", "<=", ">="))
_ONE_CHAR_OPS: Final = frozenset("=<>+-*/(),")
_DIGITS: Final = frozenset("0123456789")
_IDENT_START: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_$")
_IDENT_PART: Final = _IDENT_START | _DIGITS | {"."}

_IDENT_RE: Final = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.]*")
_NUMBER_RE: Final = re.compile(
    r"""
      0[xX][0-9a-fA-F]+[lL]?                          # hexadecimal
    | (?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)? # decimal point, optional exponent
    | [0-9]+[eE][+-]?[0-9]+                           # exponent only
    | [0-9]+[lL]?                                     # decimal or octal integer
    """,
    re.VERBOSE,
)


class _Token(NamedTuple):
    type: str
    value: Any  # keyword in upper case, operator, identifier name, decoded string, number
    pos: int  # 0-based index into the selector text
    text: str  # as written

    def describe(self) -> str:
        if self.type == _T_END:
            return "end of input"
        if self.type == _T_OP:
            return f"'{self.text}'"
        if self.type == _T_KEYWORD:
            return f"keyword {self.value}"
        if self.type == _T_IDENT:
            return f"identifier '{self.text}'"
        return f"{self.type} {self.text}"


def _error(text: str, index: int, message: str) -> SelectorSyntaxError:
    return SelectorSyntaxError(
        f"selector error at position {index + 1}: {message} in: {text}", position=index + 1, selector=text
    )


def _number(text: str, start: int, end: int) -> int | float:
    s = text[start:end]
    if s[-1] in "lL":
        s = s[:-1]
    if s[:2] in ("0x", "0X"):
        return int(s[2:], 16)
    if "." in s or "e" in s or "E" in s:
        return float(s)
    if len(s) > 1 and s[0] == "0":
        if "8" in s or "9" in s:
            raise _error(text, start, f"invalid octal number {text[start:end]}")
        return int(s, 8)
    return int(s)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    append = tokens.append
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == "'":
            chunks: list[str] = []
            j = i + 1
            while True:
                k = text.find("'", j)
                if k < 0:
                    raise _error(text, i, "unterminated string literal")
                chunks.append(text[j:k])
                if k + 1 < n and text[k + 1] == "'":  # '' is an escaped quote
                    chunks.append("'")
                    j = k + 2
                else:
                    j = k + 1
                    break
            append(_Token(_T_STRING, "".join(chunks), i, text[i:j]))
            i = j
        elif c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            m = _NUMBER_RE.match(text, i)
            assert m is not None
            j = m.end()
            if j < n and text[j] in _IDENT_PART:  # 12abc, 1.5e, 0x, 1.2.3
                while j < n and text[j] in _IDENT_PART:
                    j += 1
                raise _error(text, i, f"malformed number {text[i:j]}")
            append(_Token(_T_NUMBER, _number(text, i, j), i, text[i:j]))
            i = j
        elif c in _IDENT_START:
            m = _IDENT_RE.match(text, i)
            assert m is not None
            word = m.group()
            upper = word.upper()
            if upper in _KEYWORDS:
                append(_Token(_T_KEYWORD, upper, i, word))
            else:
                append(_Token(_T_IDENT, word, i, word))
            i = m.end()
        elif text[i : i + 2] in _TWO_CHAR_OPS:
            append(_Token(_T_OP, text[i : i + 2], i, text[i : i + 2]))
            i += 2
        elif c in _ONE_CHAR_OPS:
            append(_Token(_T_OP, c, i, c))
            i += 1
        else:
            raise _error(text, i, f"unexpected character {c!r}")
    append(_Token(_T_END, None, n, ""))
    return tokens


# --------------------------------------------------------------------------- parser


_MAX_NESTING: Final = 50
"""Parentheses, NOT and unary signs nested deeper than this are refused: the parser recurses on them."""
_MAX_DEPTH: Final = 100
"""Deepest tree accepted; evaluation recurses once or twice per level, inside the broker's own stack."""


class _Parser:
    """Recursive descent with SQL precedence: OR < AND < NOT < predicates < + - < * / < unary."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.nesting = 0

    # -- helpers

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.type != _T_END:
            self.i += 1
        return tok

    def at_keyword(self, word: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.type == _T_KEYWORD and tok.value == word

    def at_op(self, op: str) -> bool:
        tok = self.tokens[self.i]
        return tok.type == _T_OP and tok.value == op

    def fail(self, tok: _Token, expected: str) -> NoReturn:
        raise _error(self.text, tok.pos, f"expected {expected} but found {tok.describe()}")

    def expect_keyword(self, word: str) -> _Token:
        if not self.at_keyword(word):
            self.fail(self.peek(), word)
        return self.advance()

    def close_paren(self, opening: _Token) -> None:
        if not self.at_op(")"):
            self.fail(self.peek(), f"')' to match '(' at position {opening.pos + 1}")
        self.advance()

    def nest(self, tok: _Token) -> None:
        self.nesting += 1
        if self.nesting > _MAX_NESTING:
            raise _error(self.text, tok.pos, f"selector is nested more than {_MAX_NESTING} levels deep")

    def check_depth(self, root: _Node) -> None:
        stack = [(root, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > _MAX_DEPTH:
                raise _error(self.text, node.pos, f"selector is nested more than {_MAX_DEPTH} levels deep")
            stack.extend((kid, depth + 1) for kid in node.children())

    def condition(self, node: _Node) -> _Node:
        """Check that a node can stand where AND/OR/NOT or the whole selector need TRUE/FALSE."""
        if node.kind == _C_BOOL:
            return node
        if node.kind == _C_ANY:
            return _AsCondition(node)
        raise _error(self.text, node.pos, f"expected a condition but found a {node.kind}")

    # -- grammar

    def parse(self) -> _Node:
        if self.peek().type == _T_END:
            raise _error(self.text, 0, "selector is empty")
        node = self.parse_or()
        tok = self.peek()
        if tok.type != _T_END:
            self.fail(tok, "AND, OR or end of input" if node.kind == _C_BOOL else "an operator")
        node = self.condition(node)
        self.check_depth(node)
        return node

    def parse_or(self) -> _Node:
        first = self.parse_and()
        if not self.at_keyword("OR"):
            return first
        operands = [self.condition(first)]
        while self.at_keyword("OR"):
            self.advance()
            operands.append(self.condition(self.parse_and()))
        return _fold(_Or(operands))

    def parse_and(self) -> _Node:
        first = self.parse_not()
        if not self.at_keyword("AND"):
            return first
        operands = [self.condition(first)]
        while self.at_keyword("AND"):
            self.advance()
            operands.append(self.condition(self.parse_not()))
        return _fold(_And(operands))

    def parse_not(self) -> _Node:
        if self.at_keyword("NOT"):
            tok = self.advance()
            self.nest(tok)
            node = _fold(_Not(tok.pos, self.condition(self.parse_not())))
            self.nesting -= 1
            return node
        return self.parse_predicate()

    def parse_predicate(self) -> _Node:
        left = self.parse_sum()
        tok = self.peek()
        if tok.type == _T_OP and tok.value in _COMPARISONS:
            self.advance()
            return _fold(_Compare(tok.value, left, self.parse_sum()))
        negated = False
        if self.at_keyword("NOT"):
            self.advance()
            negated = True
            if not (self.at_keyword("IN") or self.at_keyword("LIKE") or self.at_keyword("BETWEEN")):
                self.fail(self.peek(), "IN, LIKE or BETWEEN after NOT")
        if self.at_keyword("IN"):
            self.advance()
            return _fold(_In(left, self.parse_in_list(), negated))
        if self.at_keyword("LIKE"):
            self.advance()
            return _fold(_Like(left, self.parse_like_pattern(), negated))
        if self.at_keyword("BETWEEN"):
            self.advance()
            low = self.parse_sum()
            self.expect_keyword("AND")
            return _fold(_Between(left, low, self.parse_sum(), negated))
        if self.at_keyword("IS"):
            self.advance()
            negated = self.at_keyword("NOT")
            if negated:
                self.advance()
            self.expect_keyword("NULL")
            return _fold(_IsNull(left, negated))
        return left

    def parse_in_list(self) -> list[object]:
        opening = self.peek()
        if not self.at_op("("):
            self.fail(opening, "'(' after IN")
        self.advance()
        items = [self.parse_in_item()]
        while self.at_op(","):
            self.advance()
            items.append(self.parse_in_item())
        self.close_paren(opening)
        return items

    def parse_in_item(self) -> object:
        tok = self.peek()
        sign = 1
        if tok.type == _T_OP and tok.value in ("+", "-"):
            self.advance()
            sign = -1 if tok.value == "-" else 1
            num = self.peek()
            if num.type != _T_NUMBER:
                self.fail(num, "a number")
            self.advance()
            return sign * num.value
        if tok.type != _T_STRING and tok.type != _T_NUMBER:
            self.fail(tok, "a string or number literal")
        self.advance()
        return tok.value

    def parse_like_pattern(self) -> Callable[[str], bool]:
        tok = self.peek()
        if tok.type != _T_STRING:
            self.fail(tok, "a string pattern after LIKE")
        self.advance()
        escape: str | None = None
        if self.at_keyword("ESCAPE"):
            self.advance()
            etok = self.peek()
            if etok.type != _T_STRING or len(etok.value) != 1:
                self.fail(etok, "a one-character string after ESCAPE")
            self.advance()
            escape = etok.value
        matcher = _like_matcher(tok.value, escape)
        if matcher is None:
            raise _error(self.text, tok.pos, f"LIKE pattern ends with its escape character '{escape}'")
        return matcher

    def parse_sum(self) -> _Node:
        left = self.parse_term()
        while True:
            tok = self.peek()
            if tok.type != _T_OP or (tok.value != "+" and tok.value != "-"):
                return left
            self.advance()
            left = _fold(_Arith(tok.value, left, self.parse_term()))

    def parse_term(self) -> _Node:
        left = self.parse_unary()
        while True:
            tok = self.peek()
            if tok.type != _T_OP or (tok.value != "*" and tok.value != "/"):
                return left
            self.advance()
            left = _fold(_Arith(tok.value, left, self.parse_unary()))

    def parse_unary(self) -> _Node:
        tok = self.peek()
        if tok.type == _T_OP and tok.value in ("+", "-"):
            self.advance()
            self.nest(tok)
            operand = self.parse_unary()
            self.nesting -= 1
            node = _Negate(tok.pos, operand) if tok.value == "-" else _Plus(tok.pos, operand)
            return _fold(node)
        return self.parse_primary()

    def parse_primary(self) -> _Node:
        tok = self.peek()
        if tok.type == _T_IDENT:
            self.advance()
            return _Ident(tok.pos, tok.value)
        if tok.type == _T_NUMBER:
            self.advance()
            return _Literal(tok.pos, tok.value, _C_NUM)
        if tok.type == _T_STRING:
            self.advance()
            return _Literal(tok.pos, tok.value, _C_STR)
        if tok.type == _T_KEYWORD and tok.value in ("TRUE", "FALSE"):
            self.advance()
            return _Literal(tok.pos, tok.value == "TRUE", _C_BOOL)
        if tok.type == _T_OP and tok.value == "(":
            self.advance()
            self.nest(tok)
            inner = self.parse_or()
            self.close_paren(tok)
            self.nesting -= 1
            return inner
        if tok.type == _T_KEYWORD and tok.value == "NULL":
            msg = "expected an expression but found keyword NULL (compare with IS NULL or IS NOT NULL)"
            raise _error(self.text, tok.pos, msg)
        self.fail(tok, "an expression")


# --------------------------------------------------------------------------- message headers


def _durable(m: Any) -> object:
    return "DURABLE" if m.durable else "NON_DURABLE"


def _delivery_mode(m: Any) -> object:
    return "PERSISTENT" if m.durable else "NON_PERSISTENT"


def _jms_message_id(m: Any) -> object:
    return f"ID:{m.id}"


_HEADERS: Final[dict[str, Fn]] = {
    "AMQPriority": operator.attrgetter("priority"),
    "JMSPriority": operator.attrgetter("priority"),
    "AMQTimestamp": operator.attrgetter("timestamp"),
    "JMSTimestamp": operator.attrgetter("timestamp"),
    "AMQExpiration": operator.attrgetter("expiration"),
    "JMSExpiration": operator.attrgetter("expiration"),
    "AMQDurable": _durable,
    "JMSDeliveryMode": _delivery_mode,
    "AMQMessageID": operator.attrgetter("id"),
    "JMSMessageID": _jms_message_id,
    "AMQAddress": operator.attrgetter("address"),
    "AMQSize": operator.attrgetter("size"),
}
"""Header identifiers; they shadow message properties of the same name."""


def _message_env(name: str) -> Fn:
    header = _HEADERS.get(name)
    if header is not None:
        return header

    def prop(m: Any) -> object:
        props = m.properties
        return None if props is None else props.get(name)

    return prop


def _mapping_env(name: str) -> Fn:
    return lambda values: values.get(name)


# --------------------------------------------------------------------------- public API


class Selector:
    """A compiled selector; immutable, so one instance can serve every consumer that uses the text."""

    __slots__ = ("_on_message", "_on_values", "text")

    def __init__(self, text: str) -> None:
        tree = _Parser(text).parse()
        self.text = text
        self._on_message = tree.compile(_message_env)
        self._on_values = tree.compile(_mapping_env)

    def matches(self, ref: MessageRef) -> bool:
        """True only if the selector is TRUE for the message (FALSE and UNKNOWN reject it)."""
        return self._on_message(ref.message) is True

    def matches_message(self, message: Message) -> bool:
        """As :meth:`matches`, for routing decisions made before a queue reference exists."""
        return self._on_message(message) is True

    def evaluate(self, values: Mapping[str, object]) -> bool | None:
        """Three-valued result against plain identifier -> value pairs (no header names)."""
        r = self._on_values(values)
        return r if type(r) is bool else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


@functools.lru_cache(maxsize=512)
def _compile_cached(text: str) -> Selector:
    return Selector(text)


def compile_selector(text: str) -> Selector:
    """Parse and compile a selector, raising InvalidSelector (a SelectorSyntaxError) if it is bad.

    Compiled selectors are cached by text: many consumers tend to share a few filters.
    """
    return _compile_cached(text)
