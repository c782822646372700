"""normcheck doctor: each fact checked against the thing it reports on (nothing is built here)."""
import io
import os
import shutil

import torch

from normcheck.doctor import collect_facts, report_lines, run_doctor
from normcheck.kernels.groupnorm import loader as groupnorm
from normcheck.kernels.syncbn.cuda import loader as cuda


def test_torch_and_cuda_facts_are_torchs_own():
    facts = collect_facts()
    assert facts.torch_version == torch.__version__
    assert facts.cuda_visible == torch.cuda.is_available()
    assert facts.torch_cuda_version == torch.version.cuda
    lines = report_lines(facts)
    assert lines[0].startswith(f"torch: {torch.__version__} ")
    assert lines[1].startswith("CUDA visible: yes" if torch.cuda.is_available() else "CUDA visible: no")


def test_nvcc_fact_is_the_nvcc_on_path(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    facts = collect_facts()
    on_path = shutil.which("nvcc")
    if on_path:
        assert facts.nvcc_path == on_path and facts.nvcc_version and facts.nvcc_version[0].isdigit()
    fallback = any(os.access(p, os.X_OK) for p in cuda.FALLBACK_NVCC)
    assert (facts.nvcc_path is not None) == (on_path is not None or fallback)


def test_without_nvcc_doctor_says_not_found(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("NORMCHECK_CUDA_LIB", raising=False)
    monkeypatch.setattr(cuda, "FALLBACK_NVCC", ())
    lines = report_lines(collect_facts())
    assert "nvcc: not found (install the CUDA toolkit, or put nvcc on PATH / set $CUDA_HOME)" in lines
    assert any(line.startswith("CUDA library: not built (needs nvcc") for line in lines)


def test_cuda_library_fact_follows_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path))
    facts = collect_facts()
    assert not facts.cuda_library_built and not facts.groupnorm_built  # an empty cache holds nothing
    out = io.StringIO()
    assert run_doctor(None, out) == 0
    text = out.getvalue()
    if facts.nvcc_path:
        assert "CUDA library: not built (build it with: python -m normcheck.kernels.syncbn.cuda.loader)" in text
        built = cuda.build()  # the real build, into the empty cache
        assert built.is_relative_to(tmp_path)
        after = collect_facts()
        assert after.cuda_library_built and after.cuda_library == built
        assert f"CUDA library: built ({built})" in report_lines(after)
    assert "GroupNorm kernel: not built (it builds on first use" in text


def test_groupnorm_fact_is_the_loaders_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path))
    directory = groupnorm.build_dir()
    assert collect_facts().groupnorm_dir == directory and not collect_facts().groupnorm_built
    directory.mkdir(parents=True)
    (directory / f"normcheck_groupnorm_{directory.name}.so").write_bytes(b"")  # what a build leaves there
    assert collect_facts().groupnorm_built
    assert f"GroupNorm kernel: built ({directory})" in report_lines(collect_facts())


def test_cli_doctor_prints_the_facts():
    import subprocess
    import sys

    import torch

    run = subprocess.run([sys.executable, "-m", "normcheck", "doctor"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"torch: {torch.__version__}")
    assert [line.split(":")[0] for line in lines] == ["torch", "CUDA visible", "nvcc", "CUDA library",
                                                      "GroupNorm kernel", "JAX", "TensorFlow"]
    assert lines[1].startswith("CUDA visible: " + ("yes" if torch.cuda.is_available() else "no"))


def test_framework_facts_name_the_installed_versions_or_the_extra():
    from importlib.util import find_spec

    lines = report_lines(collect_facts())
    for title, packages, extra in (("JAX", ("jax", "flax"), "jax"), ("TensorFlow", ("tensorflow", "keras"), "tf")):
        [line] = [line for line in lines if line.startswith(f"{title}: ")]
        if all(find_spec(p) for p in packages):
            assert all(f"{p} " in line for p in packages) and "none" not in line
        else:
            assert f'pip install -e ".[{extra}]"' in line
