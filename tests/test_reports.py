"""Reports: --json against docs/json-schema.md, --junit-xml parsed back, --plot rendered."""
import io
import json
import re
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from normcheck.cli import main
from normcheck.outputs.plot import SIZE_PX
from normcheck.cases.case import FIELD_NAMES
from normcheck.cases.tokens import decode_case

SCHEMA_DOC = Path(__file__).resolve().parents[1] / "docs" / "json-schema.md"


def run(*argv):
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


# -- --json: what docs/json-schema.md documents, key for key and type for type -----------------

def documented_tables() -> dict[str, dict[str, str]]:
    """'## `cases[].tensors[]`' -> {key: type} from the doc's tables ('## Top level' is '')."""
    tables, section = {}, None
    for line in SCHEMA_DOC.read_text().splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            section = "" if title == "Top level" else title.strip("`")
            tables[section] = {}
        elif section is not None and (m := re.match(r"\| `([a-z0-9_]+)` \| ([a-z ]+) \|", line)):
            tables[section][m.group(1)] = m.group(2)
    return tables


def conforms(value, spelled: str) -> bool:
    if " or " in spelled:  # "number or null", "boolean or string"
        first, rest = spelled.split(" or ", 1)
        return (value is None if first == "null" else conforms(value, first)) or conforms(value, rest) \
            if rest != "null" else value is None or conforms(value, first)
    if spelled.startswith("list of "):
        return isinstance(value, list) and all(conforms(v, spelled[len("list of "):]) for v in value)
    return {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "number": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("inf", "-inf", "nan"),
    }[spelled](value)


def check_against_doc(obj: dict, table: dict[str, str], where: str) -> None:
    assert set(obj) == set(table), f"{where}: keys differ from docs/json-schema.md"
    for key, spelled in table.items():
        assert conforms(obj[key], spelled), f"{where}.{key} = {obj[key]!r} is not {spelled}"


def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("argv", [
    # a failing mutant (FAIL, worst tensor), GroupNorm (unit: group), two seeds
    ["--op", "groupnorm", "--impl", "tests.mutants.groupnorm:gamma_outside_group_sums", "--shape", "2,8,5", "--groups", "4",
     "--cases", "2"],
    # a known upstream issue whose ratio is inf (dweight overflows in f16) and a mistrusted-free pass
    ["--op", "batchnorm", "--shape", "16,3,64,64", "--dtype", "f16", "--profile", "offset"],
    # SyncBN: backend and rank filled in; an empty rank
    ["--op", "syncbn", "--impl", "torch19", "--split", "3,0,2", "--dtype", "mixed-bf16"],
    # SKIP: no tensors, null worst
    ["--op", "syncbn", "--impl", "torch", "--backend", "lockstep", "--split", "2,1"],
    # fp8 output: y_fp8 and a scalar amax (worst_index [])
    ["--op", "rmsnorm", "--impl", "torch-fp8-e4m3", "--shape", "4,33", "--dtype", "bf16"],
])
def test_json_output_is_what_the_schema_doc_says(argv):
    code, out = run("compare", "--one-case", *argv, "--json")
    doc = strict_json(out)
    tables = documented_tables()
    check_against_doc(doc, tables[""], "report")
    check_against_doc(doc["summary"], tables["summary"], "summary")
    assert doc["schema"] == "normcheck-report" and doc["schema_version"] == 1 and doc["exit_status"] == code
    counts = {k: v for k, v in doc["summary"].items() if k not in ("total", "never_checked", "pairs", "hint")}
    assert doc["summary"]["total"] == len(doc["cases"]) == sum(counts.values())
    for i, case in enumerate(doc["cases"]):
        check_against_doc(case, tables["cases[]"], f"cases[{i}]")
        check_against_doc(case["case"], tables["cases[].case"], f"cases[{i}].case")
        for t in case["tensors"]:
            check_against_doc(t, tables["cases[].tensors[]"], f"cases[{i}].tensors.{t['name']}")
        # The token is the case written out beside it.
        replayed = decode_case(case["token"])
        fields = {name: getattr(replayed, name) for name in FIELD_NAMES}
        assert {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()} == case["case"]
        world = "" if doc["backend"] is None else f" --backend {doc['backend']}"
        assert case["replay"].endswith(case["token"] + world)


def test_json_of_a_non_finite_ratio_is_the_string_inf():
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--shape", "16,3,64,64", "--dtype", "f16", "--profile", "offset",
                    "--json")
    case = strict_json(out)["cases"][0]
    assert case["verdict"] == "KNOWN" and case["max_ratio"] == "inf"
    assert "inf" in next(t for t in case["tensors"] if t["max_ratio"] == "inf")["unit_ratios"]


# -- --junit-xml ---------------------------------------------------------------------------

def test_junit_xml_has_a_testcase_per_case_and_failures_carry_the_replay_line(tmp_path):
    path = tmp_path / "bn.xml"
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--impl", "tests.mutants.batchnorm:naive_variance", "--shape", "4,3,5",
                    "--profile", "offset", "--cases", "3", "--junit-xml", str(path))
    assert code == 1
    suite = ET.parse(path).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f"4x3x5 f32 contiguous offset seed={s}" for s in range(3)]
    assert suite.get("tests") == "3" and suite.get("failures") == "3"
    replays = [line.strip() for line in out.splitlines() if line.startswith("    replay:")]
    for case, replay in zip(cases, replays):
        failure = case.find("failure")
        assert failure is not None and replay in failure.text and replay[len("replay: "):] in failure.get("message")
        token = failure.text.split("--case ")[1].split()[0]
        assert decode_case(token).seed == int(case.get("name").rsplit("=", 1)[1])


def test_an_interrupted_runs_junit_xml_says_so_with_the_planned_total(tmp_path):
    from normcheck import Case, compare
    from normcheck.outputs.junit import write_junit

    reports = [compare("batchnorm", "torch", Case("batchnorm", (4, 3), "f64", seed=s)) for s in range(2)]
    path = tmp_path / "stopped.xml"
    write_junit(str(path), "batchnorm", "torch", None, reports, 1.0, stopped="interrupted by SIGINT", planned=75)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("errors") == "1" and suite.get("failures") == "0"
    error = suite.findall("testcase")[-1].find("error")
    assert error is not None and error.get("message") == "interrupted by SIGINT: 2 of 75 cases ran"
    write_junit(str(path), "batchnorm", "torch", None, reports, 1.0)  # a run that ended: nothing added
    assert ET.parse(path).getroot().find("testsuite").get("errors") == "0"


def test_junit_xml_skips_unsupported_cases_and_known_issues_unless_strict(tmp_path):
    run("compare", "--one-case", "--op", "syncbn", "--impl", "torch", "--backend", "lockstep", "--split", "2,1",
        "--junit-xml", str(tmp_path / "skip.xml"))
    skipped = ET.parse(tmp_path / "skip.xml").getroot().find("testsuite/testcase/skipped")
    assert skipped.get("type") == "unsupported" and "gloo or env world" in skipped.get("message")
    known = ["--one-case", "--op", "batchnorm", "--shape", "8,3", "--dtype", "mixed-bf16", "--memory-format", "strided",
             "--profile", "near_constant"]
    assert run("compare", *known, "--junit-xml", str(tmp_path / "known.xml"))[0] == 0
    skipped = ET.parse(tmp_path / "known.xml").getroot().find("testsuite/testcase/skipped")
    assert skipped.get("type") == "known-issue" and "torch-bn-mixed-slow-path" in skipped.get("message")
    assert run("compare", *known, "--strict", "--junit-xml", str(tmp_path / "strict.xml"))[0] == 1
    assert ET.parse(tmp_path / "strict.xml").getroot().find("testsuite/testcase/failure").get("type") == "KNOWN"


# -- --plot --------------------------------------------------------------------------------

def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_renders_heatmaps_and_a_histogram(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra: pip install -e '.[dev,plot]'")
    from matplotlib.image import imread

    path = tmp_path / "gn.png"
    code, _ = run("compare", "--one-case", "--op", "groupnorm", "--impl", "tests.mutants.groupnorm:gamma_outside_group_sums",
                  "--shape", "2,8,5", "--groups", "4", "--cases", "4", "--plot", str(path))
    assert code == 1 and png_size(path) == SIZE_PX
    pixels = imread(path)[..., :3]
    assert pixels.std() > 0.1  # not blank: heatmaps, bars and text, not one flat colour
    # Failing dx is drawn in the red end of the colour map: some strongly red pixels exist.
    red = (pixels[..., 0] > 0.6) & (pixels[..., 1] < 0.2) & (pixels[..., 2] < 0.2)
    assert red.sum() > 1000


def test_plot_without_matplotlib_is_one_line_naming_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets when it is absent
    code = main(["compare", "--op", "batchnorm", "--plot", str(tmp_path / "x.png")], io.StringIO())
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and 'pip install "normcheck[plot]"' in err
    assert not (tmp_path / "x.png").exists()


def test_a_failing_rows_got_and_expected_never_print_alike():
    """An f64 error of a few ulps can be thousands of budgets: the row prints enough digits to show it."""
    from normcheck.engine.report import TensorReport, worst_failure

    t = TensorReport("dx", 1.0, 5e3, (0, 1), 0.12345678901234, 0.12345678901299, 0, "FAIL")
    line = worst_failure([t])
    got, expected = line.split("(got ")[1].split(", error")[0].split(", expected ")
    assert got != expected and float(got) == pytest.approx(t.got, rel=1e-12)


def test_a_pass_whose_budget_is_the_tensors_own_size_is_mistrusted_and_the_run_says_what_it_never_checked():
    """Zero trust: f32 channels-last offset data gives dx a budget 453 times dx's size, so a BatchNorm whose dx drops
    its x̂ term "passes" there; that row is MISTRUSTED, and the run says dx was never checked."""
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--impl", "tests.mutants.batchnorm:drop_xhat_term", "--dtype", "f32",
                    "--memory-format", "channels_last", "--profile", "offset", "--shape", "8,64,28,28", "--json")
    doc = strict_json(out)
    case = doc["cases"][0]
    assert case["verdict"] == "MISTRUSTED" and "a pass proves little for" in case["summary"]
    assert "dx" in doc["summary"]["never_checked"]
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--impl", "tests.mutants.batchnorm:drop_xhat_term", "--shape", "8,3")
    assert code == 1 and "never checked" not in out.splitlines()[-1]  # (normal data: dx checked, and it fails)
