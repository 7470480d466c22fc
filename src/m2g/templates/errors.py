"""The one error type of the template library: its message is a single line for the user."""

from __future__ import annotations


class TemplateError(ValueError):
    """A template that does not load, or parameters it does not accept."""
