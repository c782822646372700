"""What an implementation prints while a case runs in its worker process is shown under that case's failing row (its
first lines, per rank), as pytest shows a failing test's captured output; never in --json's document, and never for a
case that passed."""
from __future__ import annotations

import io
import json

from normcheck import Case
from normcheck.cases.tokens import encode_case
from normcheck.cli import main
from normcheck.engine import FAIL, judge
from normcheck.impls import resolve_impl
from normcheck.pytest_plugin import failure_message
from normcheck.worlds import printed

TOKEN = encode_case(Case("layernorm", (4, 64), "f32"))
PRINTING = "tests._printing"


def run(*argv):
    out = io.StringIO()
    return main(["compare", "--op", "layernorm", *argv], out), out.getvalue()


def test_a_failing_row_shows_what_the_implementation_printed_in_that_case_after_its_replay_line():
    code, out = run("--impl", f"{PRINTING}:layer_norm_eps_forgotten", "--case", TOKEN)
    lines = out.splitlines()
    assert code == 1 and lines[0].startswith("FAIL"), out
    assert lines[1].startswith("    replay: ")
    shown = lines[lines.index("    printed:") + 1:]
    assert "    | layer_norm: x (4, 64) torch.float32, eps 1e-05" in shown  # its stdout
    assert "    | layer_norm: taking eps = 0.1" in shown                   # and its stderr


def test_what_a_run_prints_never_enters_the_json_document():
    code, out = run("--impl", f"{PRINTING}:layer_norm_eps_forgotten", "--case", TOKEN, "--json")
    document = json.loads(out)
    assert code == 1 and document["cases"][0]["verdict"] == FAIL
    assert "taking eps" not in out


def test_a_case_that_passes_shows_nothing_of_what_it_printed():
    code, out = run("--impl", f"{PRINTING}:layer_norm_chatty", "--case", TOKEN)
    assert code == 0 and "line 0" not in out and "printed" not in out, out


def test_what_was_printed_before_a_raise_is_shown_with_the_failure():
    code, out = run("--impl", f"{PRINTING}:layer_norm_prints_then_raises", "--case", TOKEN)
    assert code == 1 and "raised RuntimeError: no kernel for this shape" in out, out
    assert "    | about to fail" in out


def test_the_pytest_failure_text_carries_the_printed_lines_too():
    impl = resolve_impl("layernorm", f"{PRINTING}:layer_norm_eps_forgotten")
    printed.start()
    report = judge(Case("layernorm", (4, 64), "f32"), impl)
    assert report.verdict == FAIL
    text = failure_message(report, None)
    assert text.index("replay: ") < text.index("printed:") < text.index("| layer_norm: taking eps = 0.1"), text


def test_each_rank_of_a_world_is_shown_under_its_name():
    impl = resolve_impl("syncbn", f"{PRINTING}:sync_batch_norm_rank1_off", "gloo")
    printed.start()
    report = judge(Case("syncbn", (5, 3, 4), "f64", split=(2, 3)), impl)
    assert report.verdict == FAIL
    assert printed.first() == {0: "rank 0 of 2: x (2, 3, 4)\n", 1: "rank 1 of 2: x (3, 3, 4)\n"}
    assert printed.shown(printed.first())[::2] == ["    printed by rank 0:", "    printed by rank 1:"]


def test_long_output_is_cut_to_its_first_lines_and_ranks_are_named():
    texts = {0: "".join(f"line {i}\n" for i in range(30)), 2: "rank two's only line\n"}
    lines = printed.shown(texts)
    assert lines[0] == "    printed by rank 0 (first 10 of 30 lines):"
    assert lines[1:11] == [f"    | line {i}" for i in range(10)]
    assert lines[11:] == ["    printed by rank 2:", "    | rank two's only line"]
    assert printed.shown({1: "one line\n"}) == ["    printed by rank 1:", "    | one line"]  # (one of a world's)
    assert printed.shown({None: "one line\n"}) == ["    printed:", "    | one line"]  # (a single process)
