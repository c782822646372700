"""BatchNorm implementations that leave work behind for normcheck to stop (tests/test_interrupts.py): each starts a
child process (`sleep 300`) on every call; one then blocks in C holding the GIL (no Python code of its worker runs
again: neither its control thread nor a signal handler), one hangs on the run's first call only. Each call appends
its process's pid and its child's to the file $NORMCHECK_TEST_PIDS names, so the test knows the case began and which
processes to look for."""
import ctypes
import os
import subprocess
import time

import torch.nn.functional as F


def _start_child() -> None:
    child = subprocess.Popen(["sleep", "300"])
    with open(os.environ["NORMCHECK_TEST_PIDS"], "a") as f:
        f.write(f"{os.getpid()} {child.pid}\n")


def starts_a_child_and_holds_the_gil(input, running_mean, running_var, weight, bias, training, momentum, eps):
    _start_child()
    libc = ctypes.PyDLL(None)  # (a PyDLL call keeps the GIL, unlike a ctypes.CDLL one)
    while True:
        libc.sleep(300)


def starts_a_child_and_hangs_once(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """Hangs on its first call in the run (the case times out and its worker is replaced), then is torch's."""
    _start_child()
    hung = os.environ["NORMCHECK_TEST_PIDS"] + ".hung"
    if not os.path.exists(hung):
        open(hung, "w").close()
        time.sleep(600)
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
