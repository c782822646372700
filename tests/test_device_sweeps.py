"""scripts/device_sweeps.py (scripts/gpu_check.sh's judgement of torch's device kernels and the Triton kernels) runs
on any device torch names: here on the CPU, a few cases of two ops, so the GPU check cannot rot unseen."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_sweeps.py"
spec = importlib.util.spec_from_file_location("device_sweeps", SCRIPT)
device_sweeps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_sweeps)


def test_torch_records_sweep_on_a_device_and_the_table_says_what_ran(tmp_path, capsys):
    out = tmp_path / "sweeps.md"
    assert device_sweeps.main(["--device", "cpu", "--ops", "add_rmsnorm", "--every-record", "--no-triton",
                               "--limit", "2", "--markdown", str(out)]) == 0
    table = out.read_text()
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| add_rmsnorm")]
    # every record of the op, two cases each, none failing
    assert sorted(r[2].strip() for r in rows) == sorted(i.name for i in device_sweeps.OPS["add_rmsnorm"].impls)
    assert all(r[3].strip() == "2" and r[6].strip() == "0" for r in rows)
    assert "`cpu`" in table and "add_rmsnorm" in capsys.readouterr().out


def test_a_device_this_torch_lacks_is_one_line_and_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA: nothing to refuse (scripts/gpu_check.sh runs the sweeps there)")
    assert device_sweeps.main(["--device", "cuda", "--ops", "rmsnorm", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("device_sweeps: --device cuda: ") and err.count("\n") == 1
