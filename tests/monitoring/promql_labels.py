"""Whether a PromQL expression's result keeps a label: a small parser of the PromQL the dashboard uses.

It follows Prometheus' own rules for the labels of a result: an aggregation keeps only its `by` labels (all but its
`without` ones), topk/bottomk keep the input's; `on(...)` one-to-one matching keeps only the `on` labels, `ignoring`
drops its own, group_left/group_right keep the "many" side's plus those listed; `and`/`unless` keep the left side's,
`or` either's; histogram_quantile drops `le`. Anything it does not know (a function, `offset`, a subquery's `@`)
raises, so a new construct in a query is judged by someone, never passed unjudged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# A series selector's leaf question: does metric NAME with these matchers carry the label?
LeafRule = Callable[[str, dict[str, str]], bool]

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*")
    |(?P<range>\[[^\]]*\])
    |(?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=(){},])
    )""",
    re.X,
)
# Binary operators, loosest first (PromQL's precedence).
_LEVELS = (("or",), ("and", "unless"), ("==", "!=", "<=", "<", ">=", ">"), ("+", "-"), ("*", "/", "%", "atan2"), ("^",))
_AGGREGATIONS = {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "quantile", "topk", "bottomk"}
_SELECTING = {"topk", "bottomk"}  # pick series, labels untouched
_SAME_LABELS = {"rate", "increase", "irate", "delta", "abs", "ceil", "floor", "round", "clamp_min", "clamp_max"}
_SCALARS = {"time": "scalar", "vector": "vector"}


@dataclass(frozen=True)
class Value:
    kind: str  # "scalar" | "vector" | "string"
    has: bool = False
    text: str = ""


@dataclass
class _Modifiers:
    on: list[str] | None = None
    ignoring: list[str] | None = None
    group: str = ""
    include: tuple[str, ...] = ()


def tokenize(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot tokenize at {expr[pos : pos + 20]!r} in {expr!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str, label: str, leaf: LeafRule) -> None:
        self.expr, self.label, self.leaf = expr, label, leaf
        self.tokens, self.pos = tokenize(expr), 0

    def peek(self) -> str:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.pos >= len(self.tokens) or (expected is not None and self.peek() != expected):
            raise ValueError(f"expected {expected or 'more'} at token {self.pos} ({self.peek()!r}) of {self.expr!r}")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def parse(self) -> Value:
        value = self.binary(0)
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected {self.peek()!r} at token {self.pos} of {self.expr!r}")
        return value

    def binary(self, level: int) -> Value:
        if level == len(_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _LEVELS[level]:
            op = self.take()[1]
            mods = self.modifiers()
            left = self.combine(op, left, self.binary(level + 1), mods)
        return left

    def labels(self) -> list[str]:
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take()[1])
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return names

    def modifiers(self) -> _Modifiers:
        mods = _Modifiers()
        if self.peek() == "bool":
            self.take()
        if self.peek() in ("on", "ignoring"):
            setattr(mods, self.take()[1], self.labels())
        if self.peek() in ("group_left", "group_right"):
            mods.group = self.take()[1]
            mods.include = tuple(self.labels()) if self.peek() == "(" else ()
        return mods

    def combine(self, op: str, left: Value, right: Value, mods: _Modifiers) -> Value:
        if op in ("and", "unless"):
            return left
        if op == "or":
            return Value("vector", left.has or right.has)
        if left.kind == "scalar" or right.kind == "scalar":
            return right if left.kind == "scalar" else left
        if mods.group == "group_left":
            return Value("vector", left.has or (self.label in mods.include and right.has))
        if mods.group == "group_right":
            return Value("vector", right.has or (self.label in mods.include and left.has))
        if mods.on is not None:
            return Value("vector", left.has and self.label in mods.on)
        if mods.ignoring is not None:
            return Value("vector", left.has and self.label not in mods.ignoring)
        return Value("vector", left.has)

    def unary(self) -> Value:
        if self.peek() in ("-", "+"):
            self.take()
            return self.unary()
        return self.primary()

    def primary(self) -> Value:
        kind, text = self.tokens[self.pos] if self.pos < len(self.tokens) else ("", "")
        if text == "(":
            self.take("(")
            value = self.binary(0)
            self.take(")")
            return value
        if kind == "num":
            self.take()
            return Value("scalar")
        if kind == "str":
            self.take()
            return Value("string", text=text[1:-1])
        if kind == "ident" and text in _AGGREGATIONS:
            return self.aggregation()
        if kind == "ident" and self.pos + 1 < len(self.tokens) and self.tokens[self.pos + 1][1] == "(":
            return self.function()
        if kind == "ident" or text == "{":
            return self.selector()
        raise ValueError(f"unexpected {text!r} at token {self.pos} of {self.expr!r}")

    def arguments(self) -> list[Value]:
        self.take("(")
        args = []
        while self.peek() != ")":
            args.append(self.binary(0))
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return args

    def aggregation(self) -> Value:
        name = self.take()[1]
        grouping = (self.take()[1], self.labels()) if self.peek() in ("by", "without") else None
        inner = self.arguments()[-1]
        if grouping is None and self.peek() in ("by", "without"):
            grouping = (self.take()[1], self.labels())
        if name in _SELECTING:
            return Value("vector", inner.has)
        if grouping is None:
            return Value("vector", False)
        how, names = grouping
        return Value("vector", self.label in names if how == "by" else inner.has and self.label not in names)

    def function(self) -> Value:
        name = self.take()[1]
        args = self.arguments()
        if name in _SCALARS:
            return Value(_SCALARS[name])
        if name in _SAME_LABELS:
            return Value("vector", next(a for a in args if a.kind == "vector").has)
        if name == "histogram_quantile":
            return Value("vector", args[1].has and self.label != "le")
        if name in ("label_replace", "label_join"):
            return Value("vector", args[0].has or args[1].text == self.label)
        raise ValueError(f"function {name}() is not known to this parser ({self.expr!r}): add its label rule")

    def selector(self) -> Value:
        name = self.take()[1] if self.peek() != "{" else ""
        matchers: dict[str, str] = {}
        if self.peek() == "{":
            self.take("{")
            while self.peek() != "}":
                label, _, value = self.take()[1], self.take(), self.take()[1]
                matchers[label] = value[1:-1]
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
        if self.pos < len(self.tokens) and self.tokens[self.pos][0] == "range":
            self.take()
        return Value("vector", self.leaf(name or matchers.get("__name__", ""), matchers))


def keeps(expr: str, label: str, leaf: LeafRule) -> bool:
    """Whether the series `expr` returns carry `label`, given which selected series carry it (`leaf`)."""
    value = _Parser(expr, label, leaf).parse()
    if value.kind != "vector":
        raise ValueError(f"{expr!r} is a {value.kind}, not a vector")
    return value.has
