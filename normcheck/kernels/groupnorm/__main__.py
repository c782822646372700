"""python -m normcheck.kernels.groupnorm: build the kernel now (cached), print where it is and how long it took."""
import sys
import time

from .loader import load


def main() -> int:
    start = time.perf_counter()
    module = load()
    print(f"{module.__file__} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
