"""ReportError in a module of its own: build.py and paired.py both raise it, and build.py imports paired.py."""


class ReportError(ValueError):
    """A directory, or an option, the report cannot be made of; the message says what to give instead."""
