"""Problems found in policy files, and the errors that carry them.

A ``Problem`` renders as the contract's lint line ``FILE:LINE: policy/rule: message``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy source, located as precisely as we can."""

    file: str
    line: int
    policy: str
    rule: str
    message: str

    def render(self) -> str:
        where = self.policy if not self.rule else f"{self.policy}/{self.rule}"
        return f"{self.file}:{self.line}: {where or '-'}: {self.message}"


class PolicyError(Exception):
    """Base of the policy engine's errors."""


class PolicySetError(PolicyError):
    """A policy set was rejected as a whole; ``problems`` lists every reason."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        n = len(problems)
        first = problems[0].render() if problems else "no problems recorded"
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the policy set; first: {first}")


class InputError(PolicyError):
    """An evaluation input that does not match the CEL inputs (one line per problem)."""


class EngineUnavailable(PolicyError):
    """The requested CEL runtime cannot be imported."""
