#!/usr/bin/env bash
# One call on a machine with an NVIDIA GPU (issue 44, item 6): the venv with the `cuda` extra
# (cupy-cuda12x), the CUDA-marked tests, the GPU rows of the benchmarks (benchmarks/gpu_rows.py),
# and benchmarks/RESULTS-gpu.md with the GPU, its driver, the CUDA version and every step's result.
#
#     bash benchmarks/gpu_check.sh        (or: make gpu-check)
#
# Every step has its own timeout; together they stay under 8 minutes (STEP_S below). Without an
# NVIDIA GPU it stops at once with exit status 3 and says why, writing nothing. Exit status 1
# when any step failed (the report says which), 0 when all passed.
#
# Environment: PY (the Python that makes the venv, default python3), VENV (default .venv),
# EMBER_WHEELS (a folder of wheels for a machine without a package index: pip then installs
# from it only). A venv whose Python already imports cupy is used as it is.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PY:-python3}
VENV=${VENV:-.venv}
OUT=benchmarks/RESULTS-gpu.md
LOG=$(mktemp -d "${TMPDIR:-/tmp}/ember-gpu-check.XXXXXX")
# seconds per step: 15 + 45 + 180 + 30 + 90 + 90 = 450 s, under 8 minutes with the report
declare -A STEP_S=([gpu]=15 [venv]=45 [install]=180 [cupy]=30 [tests]=90 [rows]=90)
START=$(date +%s)
FAILED=()

say() { printf '%s\n' "gpu_check: $*" >&2; }

# ---------------------------------------------------------------------- 1. is there a GPU?
if ! command -v nvidia-smi >/dev/null 2>&1; then
    say "no NVIDIA GPU here: nvidia-smi is not installed (no NVIDIA driver). Nothing was run or written."
    exit 3
fi
if ! timeout "${STEP_S[gpu]}" nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader >"$LOG/gpu.txt" 2>"$LOG/gpu.err" || ! [ -s "$LOG/gpu.txt" ]; then
    say "no NVIDIA GPU here: nvidia-smi lists none ($(head -c 300 "$LOG/gpu.err")). Nothing was run or written."
    exit 3
fi
GPU_LINE=$(head -n 1 "$LOG/gpu.txt")
CUDA_DRIVER=$(timeout "${STEP_S[gpu]}" nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
say "GPU: $GPU_LINE (driver's CUDA ${CUDA_DRIVER:-unknown})"

step() {  # step NAME COMMAND...: run with the step's timeout, output to $LOG/NAME.txt
    local name=$1; shift
    local t0=$(date +%s) rc
    timeout "${STEP_S[$name]}" "$@" >"$LOG/$name.txt" 2>&1
    rc=$?
    local took=$(( $(date +%s) - t0 ))
    if [ $rc -eq 124 ]; then
        echo "stopped after ${STEP_S[$name]} s (timeout)" >>"$LOG/$name.txt"
    fi
    echo "$rc $took" >"$LOG/$name.status"
    if [ $rc -ne 0 ]; then FAILED+=("$name"); say "$name: failed (exit $rc, ${took} s)"; else say "$name: ok (${took} s)"; fi
    return $rc
}

# ---------------------------------------------------------------------- 2. the venv and CuPy
BIN=$VENV/bin
step venv bash -c "test -x '$BIN/python' || '$PY' -m venv '$VENV'"
if "$BIN/python" -c "import cupy" >/dev/null 2>&1; then
    echo "cupy already importable in $VENV: nothing installed" >"$LOG/install.txt"; echo "0 0" >"$LOG/install.status"
elif [ -n "${EMBER_WHEELS:-}" ]; then
    step install "$BIN/python" -m pip install -q --no-index --find-links "$EMBER_WHEELS" -e ".[test,cuda]"
else
    step install "$BIN/python" -m pip install -q -e ".[test,cuda]"
fi
cat >"$LOG/probe.py" <<'PROBE'
import cupy
from engine import available_devices
rt = cupy.cuda.runtime
n = rt.getDeviceCount()
name = rt.getDeviceProperties(0)["name"].decode()
v, d = rt.runtimeGetVersion(), rt.driverGetVersion()
print(f"CuPy {cupy.__version__}; CUDA runtime {v // 1000}.{v % 1000 // 10}, driver API {d // 1000}.{d % 1000 // 10}; "
      f"{n} device(s), 0: {name}")
print("engine devices:", ", ".join(str(x) for x in available_devices()))
assert any(x.is_cuda for x in available_devices()), "the engine sees no cuda device"
PROBE
step cupy "$BIN/python" "$LOG/probe.py"

# ---------------------------------------------------------------------- 3. the CUDA-marked tests
# only the files that hold CUDA-marked tests are collected (the whole tree takes a minute to
# collect); -rs lists the skips: on a GPU machine a skipped CUDA test is a failure (grep below)
mapfile -t CUDA_FILES < <(grep -rl --include='test_*.py' '@pytest.mark.cuda' tests | sort)
say "CUDA-marked tests in: ${CUDA_FILES[*]:-(none)}"
step tests env QT_QPA_PLATFORM=offscreen PYTEST_QT_API=pyside6 PYQTGRAPH_QT_LIB=PySide6 \
    "$BIN/python" -m pytest -m cuda -q -rs -p no:cacheprovider "${CUDA_FILES[@]}"
if grep -q "^SKIPPED" "$LOG/tests.txt" 2>/dev/null; then
    say "tests: some CUDA tests were skipped on a GPU machine"
    [[ " ${FAILED[*]} " == *" tests "* ]] || FAILED+=("tests (skips)")
    sed -i 's/^0 /skipped /' "$LOG/tests.status"
fi
if [ ${#CUDA_FILES[@]} -eq 0 ] || grep -q "no tests ran" "$LOG/tests.txt" 2>/dev/null; then
    [[ " ${FAILED[*]} " == *" tests "* ]] || FAILED+=("tests (none ran)")
    sed -i 's/^0 /none /' "$LOG/tests.status"
fi

# ---------------------------------------------------------------------- 4. the GPU rows
step rows env MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \
    "$BIN/python" benchmarks/gpu_rows.py --device cuda:0

# ---------------------------------------------------------------------- 5. the report
status_of() { if [ -f "$LOG/$1.status" ]; then read -r rc took <"$LOG/$1.status"; \
    case "$rc" in 0) echo "passed (${took} s)";; skipped) echo "**failed**: CUDA tests skipped on a GPU machine (${took} s)";;
        none) echo "**failed**: no CUDA test ran";; *) echo "**failed** (exit $rc, ${took} s)";; esac; else echo "not run"; fi; }
{
    echo "# Ember on a GPU: benchmarks/gpu_check.sh"
    echo
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU (name, driver, memory): $GPU_LINE"
    if [ "$(cut -d' ' -f1 "$LOG/cupy.status" 2>/dev/null)" = 0 ]; then CUPY_LINE=$(head -n 1 "$LOG/cupy.txt"); else CUPY_LINE="CuPy not usable (below)"; fi
    echo "- CUDA: the driver supports ${CUDA_DRIVER:-unknown}; $CUPY_LINE"
    echo "- CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo 2>/dev/null | head -n 1), $(nproc) cores; Python $("$BIN/python" -c 'import platform; print(platform.python_version())' 2>/dev/null)"
    echo "- Total: $(( $(date +%s) - START )) s"
    echo
    echo "## Steps"
    echo
    echo "| step | result |"
    echo "|---|---|"
    for s in venv install cupy tests rows; do echo "| $s | $(status_of "$s") |"; done
    echo
    echo "## CUDA-marked tests (pytest -m cuda)"
    echo
    echo '```'
    tail -n 40 "$LOG/tests.txt" 2>/dev/null
    echo '```'
    echo
    echo "## GPU rows (benchmarks/gpu_rows.py)"
    echo
    if [ -s "$LOG/rows.txt" ]; then cat "$LOG/rows.txt"; else echo "(no output)"; fi
    for s in install cupy; do
        if [ -f "$LOG/$s.status" ] && [ "$(cut -d' ' -f1 "$LOG/$s.status")" != 0 ]; then
            echo; echo "## $s output"; echo; echo '```'; tail -n 30 "$LOG/$s.txt"; echo '```'
        fi
    done
} >"$OUT"
say "wrote $OUT in $(( $(date +%s) - START )) s (logs in $LOG)"
if [ ${#FAILED[@]} -ne 0 ]; then
    say "failed: ${FAILED[*]}"
    exit 1
fi
exit 0
