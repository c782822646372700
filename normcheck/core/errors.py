"""The two exception types every layer shares.

A `UsageError` is a ValueError whose message is a single line meant for a person: the CLI prints it
and exits 2, the API lets it propagate. An `ImplError` says the implementation under test
misbehaved at the interface (a wrong shape or dtype, a detached output, an input modified in
place, a rank that hung): the engine turns it into a failing row.
"""


class UsageError(ValueError):
    """Bad input from the user (case options, implementation spec, ...)."""


class ImplError(Exception):
    """The implementation under test misbehaved; the message says how."""
