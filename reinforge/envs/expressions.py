"""A tiny, safe parser and evaluator of integer arithmetic (never ``eval``): the verifier of the tasks a
proposer writes (reinforge/envs/problem_synthesis.py).

Grammar (spaces between tokens ignored; ``"1 2"`` is two numbers, an error)::

    expr   := term (("+" | "-") term)*
    term   := factor ("*" factor)*
    factor := number | "(" expr ")"
    number := digit+

Anything else (a letter, a unary minus, ``/``, ``**``, an empty group) is a format error. The input is
limited to ``MAX_CHARS`` characters and every number to ``MAX_DIGITS`` digits, so evaluation is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CHARS = 64
MAX_DIGITS = 4


class ExpressionError(ValueError):
    """The text is not an expression of the grammar."""


@dataclass(frozen=True)
class Parsed:
    value: int
    numbers: tuple[int, ...]
    operators: str  # the binary operators used, in order


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.numbers: list[int] = []
        self.ops: list[str] = []

    def peek(self) -> str:
        """The next character that is not a space ("" at the end)."""
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1
        return self.s[self.i] if self.i < len(self.s) else ""

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-") and self.peek():
            op = self.peek()
            self.i += 1
            self.ops.append(op)
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() == "*":
            self.i += 1
            self.ops.append("*")
            value *= self.factor()
        return value

    def factor(self) -> int:
        if self.peek() == "(":
            self.i += 1
            value = self.expr()
            if self.peek() != ")":
                raise ExpressionError(f"expected ')' at {self.i}")
            self.i += 1
            return value
        self.peek()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] in "0123456789":
            self.i += 1
        digits = self.s[start:self.i]
        if not digits:
            raise ExpressionError(f"expected a number at {start}")
        if len(digits) > MAX_DIGITS:
            raise ExpressionError(f"a number of more than {MAX_DIGITS} digits at {start}")
        self.numbers.append(int(digits))
        return int(digits)


def parse_expression(text: str) -> Parsed:
    """The value, numbers and operators of ``text``; ``ExpressionError`` when it is not of the grammar."""
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"longer than {MAX_CHARS} characters")
    parser = _Parser(text)
    if not text.strip():
        raise ExpressionError("empty")
    value = parser.expr()
    if parser.peek():
        raise ExpressionError(f"unexpected {parser.s[parser.i]!r} at {parser.i}")
    return Parsed(value, tuple(parser.numbers), "".join(parser.ops))
