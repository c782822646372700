"""The one exception type for bad input.

A `UsageError` is a ValueError whose message is a single line meant for a person: the CLI prints it
and exits 2, the API lets it propagate.
"""


class UsageError(ValueError):
    """Bad input from the user (case options, implementation spec, ...)."""
