"""BatchNorm implementations that hang or kill their own process on some cases (torch's kernel
otherwise): the isolated world must turn each into a failing row and go on (tests/test_isolation.py); and a
GroupNorm direct-convention runner that dies as torch's native backward did (tests/test_known_issues.py)."""
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HANG_SECONDS = 600  # far beyond any limit a test sets: the world must give up on the process


def hangs_on_bf16(input, running_mean, running_var, weight, bias, training, momentum, eps):
    if input.dtype == torch.bfloat16:
        time.sleep(HANG_SECONDS)
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def exits_on_f16(input, running_mean, running_var, weight, bias, training, momentum, eps):
    if input.dtype == torch.float16:
        os._exit(3)
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def aborts_on_f16(input, running_mean, running_var, weight, bias, training, momentum, eps):
    if input.dtype == torch.float16:
        os.abort()  # SIGABRT, as a failed assertion in C++ would
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def raises_on_f16(input, running_mean, running_var, weight, bias, training, momentum, eps):
    if input.dtype == torch.float16:
        raise NotImplementedError("no f16 kernel")
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


BUILD_SECONDS = float(os.environ.get("NORMCHECK_TEST_BUILD_SECONDS", "4"))
_built = False


def builds_on_first_call(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """Correct; its first call in a process waits BUILD_SECONDS for a child process, as a kernel compiled on first
    use waits for its compiler."""
    global _built
    if not _built:
        subprocess.run([sys.executable, "-c", f"import time; time.sleep({BUILD_SECONDS})"], check=True)
        _built = True
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def slow(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """Correct, and slower than torch by a constant: a limit must follow it, not cut it."""
    time.sleep(0.2)
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def hangs_always(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """Never returns: a run must end in minutes, not a limit per case."""
    time.sleep(HANG_SECONDS)


def segfaults(case, tensors):
    """A direct-convention GroupNorm record's runner that dies as torch's native backward did in CI."""
    import signal
    os.kill(os.getpid(), signal.SIGSEGV)
