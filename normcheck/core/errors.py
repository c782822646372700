"""The exception types every layer shares.

A `UsageError` is a ValueError whose message is a single line meant for a person: the CLI prints it
and exits 2, the API lets it propagate; a `SetupError` is one about normcheck's own setup on this machine. An
`ImplError` says the implementation under test
misbehaved at the interface (a wrong shape or dtype, a detached output, an input modified in
place, a rank that hung): the engine turns it into a failing row.
"""


class UsageError(ValueError):
    """Bad input from the user (case options, implementation spec, ...)."""


class SetupError(UsageError):
    """normcheck's own setup failed on this machine (a kernel it owns cannot be built, its cache cannot be written):
    one line saying what to do, reported as the run's error wherever it is raised (a worker included), never as a
    verdict on the implementation under test."""


class ImplError(Exception):
    """The implementation under test misbehaved; the message says how."""


class CaseTimeout(ImplError):
    """The implementation ran past the case's time limit (the message says where it was); `seconds`: the limit
    that applied, where it is not the case's whole limit (the first case, cut at a look that found it stuck);
    `unstarted`: where the case still was when the limit ran out, while it had not started (a worker still reading
    the case in, or importing): a fixed limit too short to start anything, which no verdict may blame (None: it had)."""

    def __init__(self, message: str = "", seconds: float | None = None, unstarted: str | None = None):
        super().__init__(message)
        self.seconds = seconds
        self.unstarted = unstarted


class RaisedElsewhere(ImplError):
    """The implementation raised in another process: the message is the exception's one line (and where
    it was raised), `stack` its formatted traceback (for --traceback)."""

    def __init__(self, message: str, stack: str = "", ops_called=frozenset()):
        super().__init__(message)
        self.stack = stack
        self.ops_called = frozenset(ops_called)  # the kernels (aten ops) it ran before it raised


class Unsupported(Exception):
    """Raised by an implementation to decline a case it does not take (public as `normcheck.Unsupported`): the
    engine reports the case as a SKIP row with this message, never as a failure. A layer built by class raises it
    for a case its constructor cannot express.

    It may say what it takes, so that a sweep narrows its design to that (cases.narrowing.Limit) instead of losing
    the pairs its skipped cases carried: `takes` {name: the values it takes, only those}, `declines` {name: values
    it never takes}, each name a sweep factor's (order, rank, ...) or a case field's (affine, eps, ...)."""

    def __init__(self, message: str = "", takes: dict | None = None, declines: dict | None = None):
        super().__init__(message)
        self.takes = {k: tuple(v) for k, v in (takes or {}).items()}
        self.declines = {k: tuple(v) for k, v in (declines or {}).items()}

    def __reduce__(self):  # (what it takes travels with it from a worker process)
        return type(self), (str(self), self.takes, self.declines)


class NotDifferentiable(Unsupported, ImplError):
    """A contract implementation that cannot be differentiated twice (its backward is not itself
    differentiable): the engine reports its order-2 cases as SKIP rows with this message."""
