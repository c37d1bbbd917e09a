#!/usr/bin/env bash
# The one prepared GPU run: measure this GPU and write its record, then print a summary and the simulator's
# calibration against it. Made for an H100 80 GB (the course's GPU and the device kind lent by default) and
# an H200 alike: the preflight sizes every section to the card's free memory and says what it shrank.
# Nothing is installed: it uses the python that already has torch with CUDA (the lent machines' /opt/torch
# python3: torch, numpy, matplotlib are there; PyPI is not).
#
#   scripts/gpu_run.sh                 # on the GPU machine, from the repo root; at most 8 minutes
#   scripts/gpu_run.sh --quick         # a learner's card: every section, fewer points (about 5 minutes)
#   scripts/gpu_run.sh --toy           # the same path on a CPU with tiny models (seconds)
#
# Environment: PYTHON (default python3; with --toy .venv/bin/python when present), OUT (folder for the
# record and the log; default longctx/data/gpu), GPU_BENCH_TIME_CAP_S (default 400: no measurement starts
# after it and an engine run is stopped at it; the run is killed at cap + 70 s, so the whole run stays within
# 8 minutes; --quick: 240), GPU_BENCH_SECTIONS (a comma-separated subset, for tests), GPU_BENCH_ARGS (more
# gpu-bench options, e.g. "--attention-backend reference" or "--cuda-graphs off"). Afterwards copy
# $OUT/<device>.json to longctx/data/gpu/ and commit it (the device tool returns files from $OUT only).
set -euo pipefail
cd "$(dirname "$0")/.."

TOY=""
QUICK=""
if [[ "${1:-}" == "--toy" ]]; then TOY="--toy"; shift; elif [[ "${1:-}" == "--quick" ]]; then QUICK="--quick"; shift; fi
if [[ $# -gt 0 ]]; then echo "usage: scripts/gpu_run.sh [--toy | --quick]" >&2; exit 2; fi

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -n "$TOY" && -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${OUT:-longctx/data/gpu}"
CAP="${GPU_BENCH_TIME_CAP_S:-400}"
if [[ -n "$TOY" ]]; then CAP="${GPU_BENCH_TIME_CAP_S:-60}"; fi
if [[ -n "$QUICK" ]]; then CAP="${GPU_BENCH_TIME_CAP_S:-240}"; fi
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

echo "== $(date -u +%FT%TZ) $(uname -m) $("$PY" --version 2>&1)"
KEY=$("$PY" - <<'PYEOF'
import sys
try:
    import torch
except ImportError:
    sys.exit("torch is missing for this python: set PYTHON to one with torch")
from longctx.gpu.records import device_key
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}",
      file=sys.stderr)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, sm_{p.major}{p.minor}",
          file=sys.stderr)
print(device_key(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu")
PYEOF
)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv || true
[[ -n "$TOY" ]] && KEY="$KEY-toy"
[[ -n "$QUICK" ]] && KEY="$KEY-quick"
SECTIONS=()
[[ -n "${GPU_BENCH_SECTIONS:-}" ]] && SECTIONS=(--sections "$GPU_BENCH_SECTIONS")
RECORD="$OUT_DIR/$KEY.json"
LOG="$OUT_DIR/gpu-bench-$KEY.log"
set -o pipefail
# shellcheck disable=SC2086
timeout "$(( ${CAP%.*} + 70 ))" "$PY" -m longctx gpu-bench $TOY $QUICK --out "$RECORD" --time-cap-s "$CAP" "${SECTIONS[@]}" \
  ${GPU_BENCH_ARGS:-} 2>&1 | tee "$LOG"
BACKENDS=$("$PY" -c "import json, sys; from longctx.gpu.records import row_backend; r = json.load(open(sys.argv[1]))
print(' '.join(dict.fromkeys(row_backend(r, x) for x in r.get('prefill_chunks', []) + r.get('decode', []))))" "$RECORD")
for B in $BACKENDS; do
  echo "== calibration of the simulator's cost model against $RECORD ($B backend)" | tee -a "$LOG"
  "$PY" benchmarks/gpu_calibration.py "$RECORD" --fit prefill_chunks,decode --backend "$B" 2>&1 | tee -a "$LOG"
done
echo "== done: $RECORD ($(wc -c <"$RECORD") bytes), log $LOG"
[[ -z "$TOY$QUICK" ]] && echo "== next: copy $RECORD to longctx/data/gpu/$KEY.json and commit it"
[[ -n "$QUICK" ]] && echo "== in a lesson's GPU cell: show_decode_bandwidth(gpu=\"$KEY\") (after copying it to longctx/data/gpu/)"
exit 0
