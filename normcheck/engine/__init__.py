"""The engine: tolerance model, same-precision baseline, the comparison and its reports.

NumPy only (tests/meta checks that no module here imports a framework)."""
from .compare import ahead, hint_again, judge, runs_per_case
from .report import (FAIL, KNOWN, MISTRUSTED, PASS, SKIP, VERDICTS, Report, TensorReport, nothing_tested, tally,
                     tested_count)

__all__ = ["FAIL", "KNOWN", "MISTRUSTED", "PASS", "SKIP", "VERDICTS", "Report", "TensorReport", "ahead", "hint_again", "judge", "nothing_tested",
           "runs_per_case", "tally",
           "tested_count"]
