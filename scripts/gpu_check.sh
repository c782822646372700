#!/usr/bin/env bash
# The GPU check of issue 5, in one command on a machine with an NVIDIA GPU (sized for ~8 minutes
# on one H200), from the repository root or anywhere:
#
#     bash scripts/gpu_check.sh
#
# 1. makes sure torch sees the GPU (pip-installs the CUDA build of torch only if torch cannot);
# 2. builds normcheck's CUDA SyncBN library with this machine's nvcc (or loads the prebuilt
#    library named by $NORMCHECK_CUDA_LIB, or build/cuda/libnormcheck_syncbn.so, when there is no nvcc);
# 3. runs tests/test_syncbn_cuda.py: every primitive against the CPU primitives / the float64
#    reference and against torch's CUDA primitives, 64-bit indexing, and the SyncBN property suite
#    in lockstep worlds on one GPU on our kernels and on torch's;
# 4. judges every op's default sweep on CUDA for torch's records and the project's Triton kernels
#    (scripts/device_sweeps.py), and torch's SyncBN on NCCL under torchrun when the machine has >= 2 GPUs;
#    and measures which of torch's CUDA kernels are batch invariant (--check batch-invariance; issue 28) and
#    judges their forward mode (--order fwd, fwd-rev; issue 28);
# 5. benchmarks ours against torch's primitives (bytes moved / time, against measured copy bandwidth);
# 6. writes docs/gpu-results.md (dated) and copies it to $OUT when that is a directory.
# Exit status: 0 when the tests pass, 1 when some fail, 2 when the check could not run.
#
# GPU_CHECK_SECONDS (default 1100, the phases' own limits added up) caps the whole check: each phase's limit shrinks
# to what is left, less the time the report needs, and a phase with too little left is skipped and says so, so a
# lease shorter than the full check still gets docs/gpu-results.md with what finished.
# GPU_CHECK_SKIP (e.g. "sweeps") names phases not to run (tests, sweeps, invariance, forward, benchmark), for a lease
# that cannot hold them all: each skipped phase's section says so.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=docs/gpu-results.md
WORK=$(mktemp -d)
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cu130}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

say() { echo "== $*" >&2; }
BUDGET=${GPU_CHECK_SECONDS:-1100}
# capped LIMIT: LIMIT, or the seconds left before the report must be written when fewer (1 when none is left: timeout 0 would mean no limit)
capped() { local left=$(( BUDGET - 15 - SECONDS )); [ "$left" -lt 5 ] && left=1; echo $(( $1 < left ? $1 : left )); }
skipped() { [[ " ${GPU_CHECK_SKIP:-} " == *" $1 "* ]] && echo "(skipped this run: GPU_CHECK_SKIP=\"$GPU_CHECK_SKIP\")"; }
die() { echo "gpu_check: $*" >&2; exit 2; }

say "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$WORK/gpu.txt" 2>&1 \
  || die "nvidia-smi failed: no NVIDIA driver or GPU here ($(head -1 "$WORK/gpu.txt"))"
cat "$WORK/gpu.txt" >&2

say "torch"
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  have=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "none")
  say "torch ($have) sees no GPU: installing the CUDA build: pip install --upgrade torch --index-url $TORCH_INDEX"
  $PY -m pip install --quiet --disable-pip-version-check --upgrade torch --index-url "$TORCH_INDEX" \
    || die "torch $have cannot see the GPU and the CUDA build could not be installed from $TORCH_INDEX (set TORCH_INDEX to a reachable index)"
  $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || die "torch $($PY -c 'import torch; print(torch.__version__)') still sees no GPU (driver too old for its CUDA?)"
fi
missing=$($PY - <<'EOF'
import importlib.util
print(" ".join(m for m in ("numpy", "hypothesis", "pytest", "tqdm") if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  say "installing what the tests import and this machine lacks: pip install $missing"
  $PY -m pip install --quiet --disable-pip-version-check $missing || die "could not install $missing"
fi
$PY -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")' \
  | tee "$WORK/torch.txt" >&2

say "build"
if [ -z "$(command -v nvcc || true)" ] && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && [ -z "${NORMCHECK_CUDA_LIB:-}" ]; then
  if [ -f build/cuda/libnormcheck_syncbn.so ]; then
    export NORMCHECK_CUDA_LIB="$PWD/build/cuda/libnormcheck_syncbn.so"
    say "no nvcc here: loading the prebuilt $NORMCHECK_CUDA_LIB"
  fi
fi
build_start=$SECONDS
$PY -m normcheck.kernels.syncbn.cuda.loader >"$WORK/build.txt" 2>&1 || { cat "$WORK/build.txt" >&2; die "the CUDA library did not build"; }
build_s=$(( SECONDS - build_start ))
tail -1 "$WORK/build.txt" >&2
$PY -c 'import sys; from normcheck.doctor import run_doctor; run_doctor(None, sys.stdout)' >"$WORK/doctor.txt" 2>&1

say "tests (kernels, property suite on one GPU)"
skipped tests >"$WORK/tests.txt" || timeout "$(capped 330)" $PY -m pytest -o addopts="" -p no:cacheprovider -q -rs --durations=5 tests/test_syncbn_cuda.py \
  benchmarks/test_syncbn_cuda_speed.py >"$WORK/tests.txt" 2>&1
tests_rc=$?
# On a GPU machine a test skipped for want of one means the GPU was not used: that is a failure.
if [ "$tests_rc" -eq 0 ] && grep -q "no CUDA device" "$WORK/tests.txt"; then tests_rc=3; fi
tail -25 "$WORK/tests.txt" >&2

say "every op on CUDA (torch's records, the project's Triton kernels)"
$PY -c 'import triton' 2>/dev/null || $PY -m pip install --quiet --disable-pip-version-check "triton>=3.0" >&2 \
  || say "triton could not be installed: the Triton kernels' rows will say so"
limit=$(capped 240)
skipped sweeps >"$WORK/sweeps.md" || timeout "$limit" $PY scripts/device_sweeps.py --device cuda --markdown "$WORK/sweeps.md" >"$WORK/sweeps.txt" 2>&1
sweeps_rc=$?
[ -s "$WORK/sweeps.md" ] || echo "(the sweeps did not start: exit $sweeps_rc; $(tail -1 "$WORK/sweeps.txt"))" >"$WORK/sweeps.md"
[ "$sweeps_rc" -eq 124 ] && echo "(cut at $limit s: the ops above are those that finished)" >>"$WORK/sweeps.md"
tail -15 "$WORK/sweeps.txt" >&2

say "batch invariance of torch's CUDA kernels"
skipped invariance >"$WORK/invariance.txt" ||
for op in layernorm rmsnorm groupnorm instancenorm add_rmsnorm; do  # (their CPU findings are docs'; CUDA's are new)
  timeout "$(capped 40)" $PY -m normcheck compare --op "$op" --device cuda --check batch-invariance >"$WORK/inv-$op.txt" 2>&1
  echo "(exit $?)" >>"$WORK/inv-$op.txt"
  { grep -m 3 -E "^(FAIL|KNOWN).*batch invariant" "$WORK/inv-$op.txt" | cut -c1-240; grep -E " cases: |^\(exit" "$WORK/inv-$op.txt"; } \
    >>"$WORK/invariance.txt"
done

say "forward mode of torch's CUDA kernels"
skipped forward >"$WORK/forward.txt" ||
for op in batchnorm groupnorm layernorm rmsnorm instancenorm; do  # (their CPU known issues do not cover CUDA)
  for order in fwd fwd-rev; do
    timeout "$(capped 20)" $PY -m normcheck compare --op "$op" --device cuda --order "$order" >"$WORK/fwd-$op-$order.txt" 2>&1
    echo "(exit $?)" >>"$WORK/fwd-$op-$order.txt"
    { grep -m 3 -E "^FAIL" "$WORK/fwd-$op-$order.txt" | cut -c1-240; grep -E " cases: |^\(exit" "$WORK/fwd-$op-$order.txt"; } \
      >>"$WORK/forward.txt"
  done
done

gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  say "torch's SyncBN on NCCL under torchrun ($gpus GPUs)"
  NORMCHECK_ENV_BACKEND=nccl timeout "$(capped 120)" $PY -m torch.distributed.run --nproc-per-node "$gpus" -m normcheck compare --op syncbn \
    --backend env >"$WORK/nccl.txt" 2>&1
  echo "(exit $?)" >>"$WORK/nccl.txt"
else
  echo "one GPU: torch's SyncBN on NCCL needs two (skipped)" >"$WORK/nccl.txt"
fi

say "benchmark"
skipped benchmark >"$WORK/bench.md" || timeout "$(capped 150)" $PY benchmarks/test_syncbn_cuda_speed.py --markdown "$WORK/bench.md" >"$WORK/bench.log" 2>&1
bench_rc=$?
[ -s "$WORK/bench.md" ] || echo "(benchmark did not finish: exit $bench_rc; $(tail -1 "$WORK/bench.log"))" >"$WORK/bench.md"

verdict="PASSED"
[ "$tests_rc" -ne 0 ] && verdict="FAILED (pytest exit $tests_rc$([ "$tests_rc" -eq 124 ] && echo ', timed out')$([ "$tests_rc" -eq 3 ] && echo ': GPU tests skipped with "no CUDA device"'))"
{
  echo "# GPU results: normcheck's CUDA SyncBN kernels, torch's CUDA kernels of every op, Triton kernels"
  echo
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') by \`bash scripts/gpu_check.sh\` (issue 5)."
  echo
  echo "- GPU: $(cat "$WORK/gpu.txt")"
  echo "- $(cat "$WORK/torch.txt")"
  echo "- build: $(tail -1 "$WORK/build.txt") -- ${build_s} s wall, including the import of torch"
  echo "- tests/test_syncbn_cuda.py + benchmarks/test_syncbn_cuda_speed.py: **$verdict**"
  echo
  echo "## normcheck doctor"
  echo
  echo '```'
  cat "$WORK/doctor.txt"
  echo '```'
  echo
  echo "## Tests"
  echo
  echo '```'
  grep -E "passed|failed|error|FAILED|ERROR|SKIPPED|slowest|s call|s setup" "$WORK/tests.txt" | tail -60
  echo '```'
  echo
  echo "## Every op on CUDA"
  echo
  cat "$WORK/sweeps.md"
  echo
  echo "## Batch invariance of torch's CUDA kernels (--check batch-invariance; 40 s per op at most)"
  echo
  echo '```'
  cat "$WORK/invariance.txt"
  echo '```'
  echo
  echo "## Forward mode of torch's CUDA kernels (--order fwd, fwd-rev; 20 s per op and order at most)"
  echo
  echo '```'
  cat "$WORK/forward.txt"
  echo '```'
  echo
  echo "## torch's SyncBN on NCCL"
  echo
  echo '```'
  tail -5 "$WORK/nccl.txt"
  echo '```'
  echo
  echo "## Benchmark: ours vs torch's CUDA primitives"
  echo
  cat "$WORK/bench.md"
} >"$RESULTS"
say "wrote $RESULTS"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$RESULTS" "$WORK/tests.txt" "$WORK/bench.log" "$OUT/" 2>/dev/null
fi
[ "$tests_rc" -eq 0 ] && [ "$sweeps_rc" -eq 0 ] && exit 0 || exit 1
