#!/usr/bin/env bash
# The whole check on a lent GPU machine, as one command (docs/real-gpu.md, "How to check"):
#
#   OUT=/some/empty/dir bench/device_check.sh
#
# The machine has the driver, nvidia-smi and a Python with PyTorch, but none of the exporter's
# own dependencies and no package index: they travel as wheels in .whl/ (ignored by git; see
# docs/real-gpu.md for how to fill it), installed with `pip --target` into a folder of their own
# that goes first on PYTHONPATH. gpuscope itself is not installed: a folder holding
# gpuscope/exporter as a link to exporter/ makes `gpuscope.exporter` this working tree's.
#
# Steps, each under `timeout` (SIGTERM, on which the check cleans up: the MPS daemon quits, the
# files so far are written; SIGKILL 30 s later), all within GPUSCOPE_CHECK_BUDGET seconds
# (default 250; with the soak, its seconds + 90 more); a step that fails or runs out of time is
# recorded and the next one runs:
#   versions  driver, CUDA, nvidia-smi, Python, PyTorch, the machine's own pynvml and protobuf
#   install   the wheels, then which modules the check imports and from where
#   check     bench/real_gpu_check.py --load --window 30: exporter vs nvidia-smi, health (row
#             remapping, ECC), identity (UUIDs in the driver's procfs, MIG mode, XID watch),
#             work signals, what the GPM calls cost (idle and under load)
#   mps       bench/real_gpu_check.py --only mps: an MPS daemon and two clients, raw NVML
#   soak      (only when asked for, GPUSCOPE_CHECK_STEPS) bench/real_gpu_check.py --only soak
#             --soak-seconds GPUSCOPE_SOAK_SECONDS: the exporter on the driver while PyTorch
#             processes come and go, its RSS, fds, threads and scrapes every 10 s; with
#             GPUSCOPE_SOAK_MPS=1 (--soak-mps) the processes are one MPS daemon's clients
#   collect   everything into $OUT (at most 8 files, flat):
#             summary.log (all of the above), real-gpu.tar.gz (every raw output), and copies of
#             comparison.json, health.json, identity.json, work-signals.json, gpm-cost.json,
#             metrics.txt, mps.json, soak.json, in that order, while there is room for them
#             (less those named in GPUSCOPE_SKIP_COPIES)
#
# Environment: OUT (required); GPUSCOPE_WHEELS (the wheels' folder, default .whl);
# GPUSCOPE_NVML_LIBRARY (a libnvidia-ml to load instead of the driver's, passed as --library:
# bench/fake_libnvml's C double tries this script without a GPU, where the parts that need
# nvidia-smi, PyTorch or MPS report themselves skipped); GPUSCOPE_CHECK_BUDGET; GPUSCOPE_WINDOW
# (seconds of work signals, 30); GPUSCOPE_CHECK_STEPS (of check, mps, soak, comma-separated;
# default check,mps: e.g. soak alone); GPUSCOPE_SOAK_SECONDS (240; with soak, the default budget
# grows by it and 90 s more); GPUSCOPE_SOAK_MPS (1: the soak's processes as MPS clients);
# GPUSCOPE_SKIP_COPIES (file names not to copy to $OUT, e.g.
# "metrics.txt,mps.json": what is in the tarball anyway); PYTHON (python3).
set -u -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

steps=",${GPUSCOPE_CHECK_STEPS:-check,mps},"
for s in ${steps//,/ }; do
  case $s in
    check | mps | soak) ;;
    *) echo "GPUSCOPE_CHECK_STEPS: unknown step $s (of check, mps, soak)" >&2 && exit 2 ;;
  esac
done
soak_seconds=${GPUSCOPE_SOAK_SECONDS:-240}
soak_mps=${GPUSCOPE_SOAK_MPS:-}
[[ $soak_mps == 1 || -z $soak_mps ]] || { echo "GPUSCOPE_SOAK_MPS: 1 or unset, not $soak_mps" >&2; exit 2; }
# The budget: 250 s with check or mps (as ever); else 105 s for versions and install. The soak
# adds its seconds and 90 s more (the exporter's start, the last processes' stop, the summary).
budget=105
[[ $steps == *,check,* || $steps == *,mps,* ]] && budget=250
[[ $steps == *,soak,* ]] && budget=$((budget + ${soak_seconds%.*} + 90))
budget=${GPUSCOPE_CHECK_BUDGET:-$budget}
wheels=${GPUSCOPE_WHEELS:-.whl}
window=${GPUSCOPE_WINDOW:-30}
library=${GPUSCOPE_NVML_LIBRARY:-}
skip_copies=${GPUSCOPE_SKIP_COPIES:-}
skip_copies=",${skip_copies// /,},"
export PYTHON=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuscope-check.XXXXXX")
export SITE=$work/site      # the wheels, installed
export NSPATH=$work/path    # gpuscope/exporter -> ./exporter
export RESULTS=$work/real-gpu
export WHEELS=$wheels
mkdir -p "$SITE" "$NSPATH/gpuscope"
for s in ${steps//,/ }; do mkdir -p "$RESULTS/$s"; done
ln -sfn "$PWD/exporter" "$NSPATH/gpuscope/exporter"
start=$SECONDS
summary=()
failed=0

# step NAME LIMIT COMMAND...: COMMAND under timeout, LIMIT capped by what is left of the budget.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - (SECONDS - start)))
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    echo "== $name: not run, the budget of ${budget} s is spent"
    summary+=("$name: not run (budget spent)")
    failed=1
    return
  fi
  echo
  echo "== $name (limit ${limit} s, at $((SECONDS - start)) s)"
  local t0=$SECONDS rc
  timeout -s TERM -k 30 "$limit" "$@"
  rc=$?
  local verdict="rc=$rc"
  ((rc == 124)) && verdict="TIMED OUT after ${limit} s (rc 124)"
  ((rc == 137)) && verdict="KILLED after ${limit} s + 30 s (rc 137)"
  ((rc != 0)) && failed=1
  echo "== $name: $verdict, $((SECONDS - t0)) s"
  summary+=("$name: $verdict, $((SECONDS - t0)) s")
}

versions() {
  local t="timeout 20"
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  kernel: $(uname -r)  arch: $(uname -m)"
  echo "cwd: $PWD  git: $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
  $t cat /proc/driver/nvidia/version 2>&1
  echo "-- nvidia-smi"
  $t nvidia-smi 2>&1
  $t nvidia-smi --version 2>&1
  $t nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,vbios_version,compute_mode,persistence_mode,mig.mode.current,ecc.mode.current,power.limit \
    --format=csv 2>&1
  echo "-- tools"
  for tool in nvidia-smi nvidia-cuda-mps-control nvidia-cuda-mps-server dcgmi nv-hostengine; do
    printf '%-26s %s\n' "$tool" "$(command -v "$tool" || echo '(not installed)')"
  done
  echo "-- python: $(command -v "$PYTHON")"
  $t "$PYTHON" -VV 2>&1
  $t "$PYTHON" - <<'EOF' 2>&1
import importlib.metadata as md
for dist in ("nvidia-ml-py", "pynvml", "torch", "protobuf", "grpcio", "prometheus-client",
             "PyYAML", "numpy", "pip", "setuptools", "typing_extensions"):
    try:
        print(f"{dist:<20} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist:<20} (not installed)")
EOF
  echo "-- torch"
  timeout 40 "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available(), "devices", torch.cuda.device_count(),
*(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))' 2>&1 | tail -5
  return 0
}

install() {
  # The wheels this Python can use: every pure one, and of the binary ones (msgspec and PyYAML
  # are there for CPython 3.11 to 3.13) those of its version, or an abi3 one of an older.
  local found
  mapfile -t found < <("$PYTHON" - "$WHEELS" <<'EOF'
import glob, os, sys
minor = sys.version_info[1]
for wheel in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
    py, abi = os.path.basename(wheel)[:-4].split("-")[-3:-1]
    if (py.startswith("py3") or py == f"cp3{minor}"
            or (abi == "abi3" and py.startswith("cp3") and int(py[3:]) <= minor)):
        print(wheel)
EOF
  )
  if ((${#found[@]} == 0)); then
    echo "no wheels in $WHEELS: relying on the packages the machine has"
  else
    echo "${#found[@]} wheels from $WHEELS into $SITE"
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --disable-pip-version-check --upgrade --target "$SITE" "${found[@]}"; then
      echo "pip failed: unpacking the wheels instead"
      "$PYTHON" - "$SITE" "${found[@]}" <<'EOF' || return 1
import os, sys, zipfile
site = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            head, _, rest = name.partition("/")
            target = name
            if head.endswith(".data"):  # purelib/platlib into the folder; scripts etc. not
                kind, _, target = rest.partition("/")
                if kind not in ("purelib", "platlib"):
                    continue
            if not target or target.endswith("/"):
                continue
            path = os.path.join(site, target)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(name) as src, open(path, "wb") as dst:
                dst.write(src.read())
    print("unpacked", os.path.basename(wheel))
EOF
    fi
  fi
  # An older protobuf of the machine's may ship google/__init__.py: a regular package later on
  # the path beats the namespace portion in $SITE, and google.protobuf would be the machine's.
  # One here makes $SITE's google the package (only for the check's own processes).
  if [[ -d $SITE/google && ! -e $SITE/google/__init__.py ]]; then
    : >"$SITE/google/__init__.py"
  fi
  PYTHONPATH=$SITE:$NSPATH "$PYTHON" - <<'EOF'
import importlib, importlib.metadata as md
bad = 0
for module, dist in (("gpuscope.exporter.cli", None), ("gpuscope.exporter.sources.nvml", None),
                     ("pynvml", "nvidia-ml-py"), ("google.protobuf", "protobuf"),
                     ("prometheus_client", "prometheus-client"), ("yaml", "PyYAML"),
                     ("h2", "h2"), ("lightkube", "lightkube"), ("httpx2", "httpx2"),
                     ("msgspec", "msgspec")):
    try:
        m = importlib.import_module(module)
        version = md.version(dist) if dist else ""
        print(f"{module:<32} {version:<12} {getattr(m, '__file__', None)}")
    except Exception as exc:
        bad += 1
        print(f"{module:<32} IMPORT FAILED: {type(exc).__name__}: {exc}")
from google.protobuf.internal import api_implementation
print("protobuf implementation:", api_implementation.Type())
raise SystemExit(bad)
EOF
}

# exec: the time limit's SIGTERM reaches Python itself, which cleans up and writes its files.
check() {
  PYTHONPATH=$SITE:$NSPATH exec "$PYTHON" bench/real_gpu_check.py --out "$RESULTS/check" \
    --load --window "$window" ${library:+--library "$library"}
}

mps() {
  PYTHONPATH=$SITE:$NSPATH exec "$PYTHON" bench/real_gpu_check.py --out "$RESULTS/mps" --only mps \
    ${library:+--library "$library"}
}

soak() {
  PYTHONPATH=$SITE:$NSPATH exec "$PYTHON" bench/real_gpu_check.py --out "$RESULTS/soak" \
    --only soak --soak-seconds "$soak_seconds" ${soak_mps:+--soak-mps} \
    ${library:+--library "$library"}
}

collect() {
  # $OUT: summary.log (written by tee), the tarball, and the files read first; flat names.
  "$PYTHON" - "$RESULTS" "$OUT/real-gpu.tar.gz" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[2], "w:gz") as tar:
    tar.add(sys.argv[1], arcname="real-gpu")
EOF
  # The device tool brings back at most 8 files: summary.log, the tarball, then these in turn
  # while there is room (what does not fit is in the tarball).
  local f name copied=2 left=()
  for f in check/comparison.json check/health.json check/identity.json check/work-signals.json \
    check/gpm-cost.json check/metrics.txt mps/mps.json soak/soak.json; do
    name=$(basename "$f")
    [[ -f $RESULTS/$f && $skip_copies != *,$name,* ]] || continue
    if ((copied < 8)); then
      cp "$RESULTS/$f" "$OUT/$name"
      copied=$((copied + 1))
    else
      left+=("$name")
    fi
  done
  ((${#left[@]})) && echo "not copied to \$OUT (8 files at most; in the tarball): ${left[*]}"
  ls -l "$OUT"
}

export library window soak_seconds soak_mps
export -f versions install check mps soak

main() {
  echo "gpuscope device check: OUT=$OUT work=$work budget=${budget} s" \
    "library=${library:-driver} steps=${steps:1:-1}"
  step versions 45 bash -c versions
  step install 60 bash -c install
  [[ $steps == *,check,* ]] && step check 150 bash -c check
  [[ $steps == *,mps,* ]] && step mps 100 bash -c mps
  [[ $steps == *,soak,* ]] && step soak $((${soak_seconds%.*} + 90)) bash -c soak
  echo
  echo "== summary ($((SECONDS - start)) s in all)"
  printf '  %s\n' "${summary[@]}"
  for f in check/steps.json mps/steps.json soak/steps.json; do
    [[ -f $RESULTS/$f ]] && echo "  $f: $(tr -d '\n' <"$RESULTS/$f" | tr -s ' ')"
  done
  collect
  rm -rf "$work"
  return $failed
}

main 2>&1 | tee "$OUT/summary.log"
exit "${PIPESTATUS[0]}"
