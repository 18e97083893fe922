"""The one error a selector can raise: where in its text the problem is, and what it is."""

from __future__ import annotations

__all__ = ["SelectorError"]


class SelectorError(ValueError):
    """A selector that does not parse: a bad token, a missing operand, a bad ESCAPE, too
    deep a nesting, a value of the wrong kind (``NOT 5``)...

    ``str(err)`` is ``selector error at column <column>: <problem>``. `column` is 1-based and
    counts characters (code points) of the selector text; a problem found at the end of the
    text is reported one column past its last character.
    """

    def __init__(self, column: int, problem: str) -> None:
        self.column = column
        self.problem = problem
        super().__init__(f"selector error at column {column}: {problem}")

    def __reduce__(self) -> tuple[type[SelectorError], tuple[int, str]]:
        # The default would call SelectorError(message) on unpickling: rebuild from the parts.
        return (SelectorError, (self.column, self.problem))
