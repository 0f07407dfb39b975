#!/usr/bin/env bash
# Issue 24's proof on a GPU, as one prepared run on a device machine (jax
# 0.11.2 with CUDA installed there; nothing outside it reachable):
#
#   run(command="bash benchmarks/gpu_check.sh", timeout_s=840)
#
# It installs this checkout with --no-deps (a wheel from dist/ if carried)
# into a venv over the machine's own packages, then runs `doctor`, `patch
# check` (the upstream pull requests against the installed jax), the suite
# (whose test_patch.py applies them to a copy of jax), and
# `jax-closure-cache bench --only jit`; each step is bounded (the limits
# below, about 10 minutes in all) and its output kept.
# The record is written to $OUT/gpu-jax-<version>.md, to be committed as
# benchmarks/gpu-jax-<version>.md. Dry-run it on a CPU with PYTHON=... and
# OUT=... (the record then says which platform it ran on).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out_dir="${OUT:-$(mktemp -d)}"
py="${PYTHON:-python3}"
work="$(mktemp -d)"
# seconds per step: doctor, patch check, the suite, seed 001's bench rows,
# the jit bench
DOCTOR=90 PATCH=60 SUITE=${SUITE_LIMIT:-270} SEED=90 BENCH=${BENCH_LIMIT:-150}

# A venv that sees the machine's own packages (jax with CUDA) through a .pth
# line after its own, so that this checkout, installed there, comes first
# and its start-up hook is a site .pth like a user's.
"$py" -m venv "$work/venv" || exit 1
v="$work/venv/bin/python"
"$py" -c 'import sysconfig; p = sysconfig.get_paths()
print(p["purelib"]); print(p["platlib"])' \
  > "$("$v" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_machine.pth"
# A wheel built beforehand (pip wheel --no-deps -w dist .; carried as
# dist/) needs no setuptools there; else the source, else the checkout.
installed=""
for whl in "$repo"/dist/jax_closure_cache-*.whl; do
  [ -e "$whl" ] && "$v" -m pip install --quiet --no-deps --ignore-installed --no-index "$whl" \
    >> "$work/install.txt" 2>&1 && installed="$whl" && break
done
if [ -z "$installed" ] && "$v" -m pip install --quiet --no-deps --ignore-installed \
    --no-build-isolation "$repo" >> "$work/install.txt" 2>&1; then
  installed="the checkout's source"
fi
if [ -z "$installed" ]; then
  tail -n 5 "$work/install.txt"
  echo "install failed; running from the checkout (PYTHONPATH), no C entrance"
  export PYTHONPATH="$repo"
  installed="none (PYTHONPATH)"
fi
echo "installed: $installed"
version="$("$v" -c 'import jax; print(jax.__version__)')"
record="$out_dir/gpu-jax-$version.md"
cd "$repo/tests" || exit 1

step() {   # step TITLE LIMIT COMMAND...: runs it bounded, appends its tail
  local title="$1" limit="$2" start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" > "$work/step.txt" 2>&1
  rc=$?
  {
    echo "## $title"
    echo
    echo "\`$*\` (limit ${limit} s): exit $rc in $(( $(date +%s) - start )) s"
    echo
    echo '```'
    tail -n 40 "$work/step.txt"
    echo '```'
    echo
  } >> "$record"
  echo "$title: exit $rc"
}

{
  echo "# jax $version on $("$v" -c 'import jax; print(jax.devices()[0].device_kind, "x", jax.device_count())')"
  echo
  echo "Written by \`benchmarks/gpu_check.sh\` on $(date -u +%Y-%m-%d), from commit"
  echo "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '(no git)')."
  echo "Platform: $("$v" -c 'import jax; print(jax.default_backend())'); Python $("$v" -c 'import sys; print(sys.version.split()[0])'); installed: $(basename "$installed")."
  echo
} > "$record"

step "doctor" "$DOCTOR" "$v" -m jax_closure_cache doctor
step "patch check (the installed jax)" "$PATCH" "$v" -m jax_closure_cache patch check
step "the suite" "$SUITE" "$v" -m pytest -q -rfEs \
  -p no:cacheprovider . --fuzz-examples 20
# seed 001's rows first (the issue's figure: 4x4 within 1.5x of hoisted, 0
# compiles from call 3), then the whole jit table as far as its limit goes
step "bench --only jit --match seed001" "$SEED" "$v" -m jax_closure_cache \
  bench --only jit --match seed001
step "bench --only jit" "$BENCH" "$v" -m jax_closure_cache bench --only jit
echo "record: $record"
