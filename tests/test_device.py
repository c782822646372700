"""--device: a single-process op's torch implementation gets the case's tensors on a device (the CLI, the API, the
pytest plugin's --normcheck-device, JSON reports and replay lines). Without a GPU the CPU paths are checked: the
default and `--device cpu` give the same reports; `cpu:0` takes the device path (every tensor through to_device, its
strides and storage offset kept) and must agree too; a device this torch lacks is one line, exit 2."""
import io
import json

import pytest
import torch

from normcheck import Case, compare
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.engine.compare import case_inputs
from normcheck.frameworks.torch import torch_inputs
from normcheck.impls import resolve_impl

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the error cannot happen")

# A short sweep: three seeds of one case in a layout that is neither dense nor at offset 0 in its storage
SHORT = ("compare", "--one-case", "--op", "layernorm", "--shape", "4,6,5", "--dtype", "f16", "--memory-format", "strided:sliced",
         "--cases", "3", "--json")


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out)
    return code, out.getvalue()


def _verdicts(doc):
    return [(c["label"], c["verdict"], c["max_ratio"], [(t["name"], t["max_ratio"]) for t in c["tensors"]])
            for c in doc["cases"]]


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_the_cli_gives_the_default_report_on_the_cpu(device):
    code, default = run(*SHORT)
    code_on, on = run(*SHORT, "--device", device)
    default, on = json.loads(default), json.loads(on)
    assert code == code_on == 0
    assert _verdicts(on) == _verdicts(default) and len(on["cases"]) == 3
    assert default["device"] == "cpu" and on["device"] == device
    # a replay line names a device that is not the default one (and replays it)
    replay = on["cases"][0]["replay"]
    assert ("--device" in replay) == (device != "cpu") and replay.endswith(f"--device {device}" if device != "cpu"
                                                                            else on["cases"][0]["token"])


@pytest.mark.parametrize("x_format", ["contiguous", "strided", "sliced", "transposed", "channels_last"])
@pytest.mark.parametrize("world", ["isolated", "in-process"])
def test_the_api_gives_the_default_report_on_the_cpu(x_format, world):
    case = Case("batchnorm", (4, 3, 5, 5), "bf16", x_format=x_format, dy_format="sliced", seed=1)
    reports = [compare("batchnorm", resolve_impl("batchnorm", "torch", world, device=device), case)
               for device in (None, "cpu", "cpu:0")]
    assert [r.device for r in reports] == ["cpu", "cpu", "cpu:0"]
    assert len({(r.verdict, tuple((t.name, t.max_ratio) for t in r.tensors)) for r in reports}) == 1
    assert compare("batchnorm", "torch", case, device="cpu").verdict == reports[0].verdict


def test_a_worker_rebuilds_the_record_on_its_device():
    assert resolve_impl("layernorm", "torch", device="cpu:0").portable().device == "cpu:0"
    assert resolve_impl("layernorm", "torch").portable().device == "cpu"
    assert resolve_impl("layernorm", torch.nn.functional.layer_norm, device="cpu:0").portable().device == "cpu:0"


@no_cuda
def test_a_device_this_torch_lacks_is_one_line_exit_2(capsys):
    assert run("compare", "--op", "layernorm", "--device", "cuda")[0] == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("normcheck: error: --device cuda: this torch (") \
        and "has no CUDA device" in err
    with pytest.raises(UsageError, match=r"^--device cuda:1: this torch \([^)]*\) has no CUDA device[^\n]*$"):
        compare("layernorm", "torch", Case("layernorm", (4, 6)), device="cuda:1")


@pytest.mark.parametrize("argv, message", [
    (["--op", "layernorm", "--device", "gpu0"], "--device gpu0: not a device torch names"),
    (["--op", "layernorm", "--device", "meta"], "--device meta: meta tensors hold no values to compare"),
    (["--op", "layernorm", "--impl", "baseline", "--device", "cpu:0"],
     "--device cpu:0: baseline is a NumPy implementation; --device places torch implementations' tensors"),
    (["--op", "syncbn", "--device", "cpu:0"], "--device cpu:0: the gloo world runs its ranks on cpu"),
])
def test_device_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert run("compare", *argv)[0] == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"normcheck: error: {message}"), err


@pytest.mark.parametrize("device", ["cpu:0", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("x_format", ["strided", "sliced", "transposed"])
def test_on_a_device_the_case_keeps_its_strides_and_torch_passes(device, x_format):
    seen = {}

    def layer_norm(x, normalized_shape, weight, bias, eps):
        seen.update(device=x.device.type, stride=x.stride(), offset=x.storage_offset())
        return torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)

    case = Case("layernorm", (4, 6, 5), "f32", x_format=x_format)
    x = torch_inputs(case_inputs(case)).x
    report = compare("layernorm", resolve_impl("layernorm", layer_norm, "in-process", device=device), case)
    assert seen == {"device": torch.device(device).type, "stride": x.stride(), "offset": x.storage_offset()}
    assert report.verdict == "PASS" and report.device == device, report.summary()
    assert compare("layernorm", "torch", case, device=device).verdict == "PASS"  # (in its isolated worker)


@needs_cuda
def test_on_cuda_the_cli_runs_a_sweep_and_replays_on_the_device():
    code, text = run(*SHORT, "--device", "cuda")
    doc = json.loads(text)
    assert code == 0 and doc["device"] == "cuda" and all(c["replay"].endswith("--device cuda") for c in doc["cases"])
