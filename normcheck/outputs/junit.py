"""`--junit-xml PATH`: one <testcase> per case, in the JUnit XML that CI systems display.

FAIL becomes <failure> (message: the summary; text: summary and replay line); SKIP becomes
<skipped>; KNOWN (a recorded upstream issue) is <skipped type="known-issue"> like pytest's xfail,
or a <failure> under --strict; PASS and MISTRUSTED pass (MISTRUSTED says so in <system-out>).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ..engine import FAIL, KNOWN, MISTRUSTED, SKIP, Report
from .replay import report_replay


def write_junit(path: str, op: str, impl: str, backend: str | None, reports: list[Report], seconds: float,
                strict: bool = False, timeout: float | None = None, stopped: str = "", planned: int | None = None) -> None:
    """`stopped`: why the run ended before its last case (an interrupt, --maxfail, a stuck implementation): then one more testcase, an error saying
    so with the planned total, so that the file never reads as a complete, green run."""
    suite_name = f"normcheck.{op}.{impl}"
    failing = {FAIL, KNOWN} if strict else {FAIL}
    skipping = {SKIP} if strict else {SKIP, KNOWN}
    failed = [r for r in reports if r.verdict in failing]
    skipped = [r for r in reports if r.verdict in skipping]
    counts = dict(tests=str(len(reports) + bool(stopped)), failures=str(len(failed)), errors=str(int(bool(stopped))),
                  skipped=str(len(skipped)), time=f"{seconds:.3f}")
    root = ET.Element("testsuites", name="normcheck", **counts)
    suite = ET.SubElement(root, "testsuite", name=suite_name, **counts)
    for r in reports:
        # The seed is in the name: with --cases K the same label occurs K times.
        case = ET.SubElement(suite, "testcase", classname=suite_name, name=f"{r.case.label} seed={r.case.seed}",
                             time=f"{r.seconds:.4f}")
        replay = report_replay(r, backend, timeout)
        if r.verdict in failing:
            failure = ET.SubElement(case, "failure", type=r.verdict, message=f"{r.summary()}  replay: {replay}")
            failure.text = f"{r.summary()}\nreplay: {replay}\n"
        elif r.verdict in skipping:
            ET.SubElement(case, "skipped", type="known-issue" if r.verdict == KNOWN else "unsupported",
                          message=r.summary())
        elif r.verdict == MISTRUSTED:
            ET.SubElement(case, "system-out").text = f"MISTRUSTED: {r.summary()}\nreplay: {replay}\n"
    if stopped:
        case = ET.SubElement(suite, "testcase", classname=suite_name, name="the run", time="0")
        ET.SubElement(case, "error", type="interrupted" if stopped.startswith("interrupted") else "stopped",
                      message=f"{stopped}: {len(reports)} of {planned if planned is not None else '?'} cases ran")
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
