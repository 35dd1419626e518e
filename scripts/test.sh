#!/bin/sh
# The project's test run (make test). Sets everything up itself on a fresh Debian 12 machine (as root):
#   1. setup (host packages, podman config, .venv), the host check (scripts/doctor.py), test images, test tools and a bundle from the local mirror
#   2. lint: ansible-lint (production profile), yamllint, scripts/copy-check.py (tasks copied across roles)
#   3. unit: pytest tests/
#   4. every Molecule scenario (molecule/*/molecule.yml), longest first, in two parallel lanes
#   5. bench: the smoke versions of the benchmarks (bench/deploy.py, bench/cardinality.py, bench/mgmt.py)
# A full run queues lint, unit and bench in those lanes too (by their durations), beside the scenarios: much of a scenario's
# time is waiting, which they use.
# Runs every phase even after a failure, exits non-zero if anything failed, and ends with a one-line summary.
#
#   scripts/test.sh                    everything
#   scripts/test.sh lint | unit | bench  one phase
#   scripts/test.sh prepare            only what the scenarios and benchmarks need (images, tools, test bundle)
#   scripts/test.sh molecule [NAME..]  some or all scenarios
set -u
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg"
export HPCOBS_TOOLS_BIN="$root/.cache/tools/bin"
# The tests install from the local-mirror bundle plus the stand-ins of molecule/standins (components that cannot
# be had here); the local-mirror bundle itself stays as built.
export HPCOBS_BUNDLE_DIR="${HPCOBS_TEST_BUNDLE_DIR:-$root/.cache/bundle-test/bundle}"
# Both are signed by this machine's throw-away key (scripts/bundle.sh local makes it): verification stays on.
export HPCOBS_BUNDLE_ALLOWED_SIGNERS="${HPCOBS_TEST_ALLOWED_SIGNERS:-$root/.cache/signing/allowed_signers}"
export PY_COLORS=1 ANSIBLE_FORCE_COLOR=1
# Molecule wraps what it prints at the terminal's width (80 without one): keep test output lines whole in the logs.
export COLUMNS=${COLUMNS:-250}
mkdir -p .cache/logs

results=""
failed=0
digests=""  # phases whose failures are summarised at the end (.cache/logs/failures-<phase>.txt)
started=$(date +%s)

note() { printf '\n==== %s ====\n' "$*"; }
record() { # name status seconds
  results="$results $1:$2(${3}s)"
  [ "$2" = ok ] || failed=1
}
run_step() { # name command...
  name=$1; shift
  t0=$(date +%s)
  note "$name"
  if "$@"; then status=ok; else status=FAIL; fi
  record "$name" "$status" $(( $(date +%s) - t0 ))
}

prepare() {
  mkdir -p .cache
  # One preparation at a time on this machine (two test runs must not build the same bundle at once).
  exec 6>.cache/prepare.lock
  flock 6
  scripts/setup.sh || return 1
  # What every scenario relies on (systemd containers, container DNS, ulimits, disk, memory), proved in seconds
  # before the long work; the doctor builds the debian12 test image first when it is missing.
  python3 scripts/doctor.py || return 1
  # Images (debootstrap) and the local-mirror bundle are independent: build them side by side.
  scripts/build-images.sh >.cache/logs/images.log 2>&1 &
  images=$!
  { python3 scripts/local-mirror/build.py tools --out .cache/tools/bin &&
    scripts/bundle.sh local &&
    python3 molecule/standins/build-test-bundle.py --from .cache/bundle-local/bundle --to "$HPCOBS_BUNDLE_DIR"
  } >.cache/logs/bundle.log 2>&1
  bundle_rc=$?
  wait $images
  images_rc=$?
  grep -E "build-images:" .cache/logs/images.log
  grep -E "local-mirror:|MISSING|Bundle:|bundle:|stand-in" .cache/logs/bundle.log | sed 's/^ *//'
  exec 6>&-
  [ $images_rc = 0 ] || { tail -30 .cache/logs/images.log; echo "images: FAILED"; }
  [ $bundle_rc = 0 ] || { tail -40 .cache/logs/bundle.log; echo "bundle: FAILED"; }
  [ $images_rc = 0 ] && [ $bundle_rc = 0 ]
}

lint() {
  rc=0
  yamllint --strict . || rc=1
  ansible-lint --profile production --offline || rc=1
  python3 scripts/copy-check.py || rc=1
  return $rc
}

unit() {
  rm -f .cache/logs/failures-unit.txt
  # the 20 slowest tests are listed at the end of the log: where the unit phase's time goes
  pytest -q --durations=20 tests >.cache/logs/unit.log 2>&1
  rc=$?
  cat .cache/logs/unit.log
  [ $rc = 0 ] || { failure_digest .cache/logs/unit.log >.cache/logs/failures-unit.txt; digests="$digests unit"; }
  return $rc
}

# The benchmarks' smoke versions (make bench-smoke), one after another: deploy and cardinality share the
# hpcobs-bench- containers and network, the management host's runs on loopback only.
bench() {
  rc=0
  python3 bench/deploy.py --smoke || rc=1
  python3 bench/cardinality.py --json .cache/bench/cardinality-smoke.json || rc=1
  python3 bench/mgmt.py --smoke || rc=1
  return $rc
}

# Scenarios, longest first, so that the lanes below finish close together: the durations this machine last
# recorded, else these (seconds, measured on a 2-CPU machine), else "long".
typical_seconds="default:1450 slurm:700 grafana:420 slurm_native:400 management:400 gpu_node:140 hw_exporters:250
bundle_faults:160 logs:150 node_exporter:60 unit:300 lint:60 bench:400"
scenarios() { # [--with-checks] [scenario...]: --with-checks queues lint, unit and bench among them
  checks=""
  if [ "${1:-}" = --with-checks ]; then
    checks="lint unit bench"
    shift
  fi
  if [ $# -gt 0 ]; then
    echo "$@"
    return
  fi
  { for file in molecule/*/molecule.yml; do basename "$(dirname "$file")"; done; for name in $checks; do echo "$name"; done; } |
  while read -r name; do
    seconds=$(cat ".cache/logs/duration-$name" 2>/dev/null ||
      printf '%s\n' $typical_seconds | sed -n "s/^$name://p" | grep . || echo 100000)
    echo "$seconds $name"
  done | sort -rn | awk '{printf "%s ", $2} END {print ""}'
}

# One scenario, or lint or unit, as run by the lanes of molecule_all: its own log, its own artifact cache, a result
# file.
one_scenario() {
  scenario=$1
  t0=$(date +%s)
  case $scenario in
    lint | unit | bench)
      log=.cache/logs/$scenario-lane.log
      label=$scenario
      if $scenario >"$log" 2>&1; then status=ok; else status=FAIL; fi
      ;;
    *)
      log=.cache/logs/molecule-$scenario.log
      label="molecule $scenario"
      export HPCOBS_ARTIFACT_CACHE="$root/.cache/artifacts/$scenario"
      if molecule test -s "$scenario" >"$log" 2>&1; then status=ok; else status=FAIL; fi
      ;;
  esac
  seconds=$(( $(date +%s) - t0 ))
  [ $status = ok ] && echo "$seconds" >".cache/logs/duration-$scenario"
  {
    note "$label: $status (${seconds}s, log: $log)"
    if [ $status = ok ]; then
      grep -E "passed|failed" "$log" | grep -E "=====|passed in" | tail -1
    else
      grep -vE "^\s*$" "$log" | tail -60
    fi
  } >".cache/logs/result-$scenario.txt"
  if [ $status != ok ] && [ ! -s ".cache/logs/failures-$scenario.txt" ]; then
    failure_digest "$log" >".cache/logs/failures-$scenario.txt"
  fi
  echo "$status $seconds" >".cache/logs/result-$scenario"
}

# What failed in a Molecule log, in a few lines: failed Ansible tasks, failed tests and their first error lines.
failure_digest() {
  # Molecule prefixes the output of the programs it runs with a box line ("  │ ").
  sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^ *│ \{0,1\}//' "$1" | awk '
    # an Ansible failure is shown with its task, unless the play ignored it
    pending != "" { if ($0 !~ /^\.\.\.ignoring/) print pending; pending = "" }
    /^TASK \[/ { task = $0; next }
    /^(fatal|failed): / { pending = (task != "" ? task "\n" : "") substr($0, 1, 400); task = ""; next }
    /^___+ .* ___+$/ { print; errors = 0; next }
    /^E   / { if (++errors <= 3) print substr($0, 1, 400); next }
    /^FAILED - RETRYING/ { next }
    /^(FAILED|ERROR) / || /Executed: Failed/ { print substr($0, 1, 400) }
    END { if (pending != "") print pending }
  ' | tail -60
}

# Scenarios run in HPCOBS_TEST_JOBS lanes (default 2): each has its own hosts and podman network, and much of a
# scenario's time is waiting (services starting, alert windows), which the other lane uses.
molecule_all() { # [--with-checks] [scenario...]
  rc=0
  list=$(scenarios "$@")
  jobs=${HPCOBS_TEST_JOBS:-2}
  note "molecule ($jobs lanes): $list"
  for scenario in $list; do
    rm -f ".cache/logs/result-$scenario" ".cache/logs/result-$scenario.txt" ".cache/logs/failures-$scenario.txt"
  done
  printf '%s\n' $list | xargs -P "$jobs" -I{} sh -c \
    'scripts/test.sh _scenario "$1"; cat ".cache/logs/result-$1.txt"' sh {}
  for scenario in $list; do
    if [ -f ".cache/logs/result-$scenario" ]; then
      read -r status seconds <".cache/logs/result-$scenario"
    else
      status=FAIL seconds=0
    fi
    [ "$status" = ok ] || rc=1
    case $scenario in lint | unit | bench) record "$scenario" "$status" "$seconds" ;; *) record "molecule:$scenario" "$status" "$seconds" ;; esac
    [ -s ".cache/logs/failures-$scenario.txt" ] && digests="$digests $scenario"
  done
  return $rc
}

phase=${1:-all}
[ $# -gt 0 ] && shift
case "$phase" in
  all)
    run_step prepare prepare
    [ $failed = 0 ] && molecule_all --with-checks
    ;;
  lint) scripts/setup.sh && run_step lint lint ;;
  unit) run_step unit unit ;;
  # what the scenarios and the benchmarks need (images, tools, the test bundle), nothing run
  prepare) run_step prepare prepare ;;
  _scenario) one_scenario "$1"; exit 0 ;;
  bench) run_step bench bench ;;
  molecule)
    run_step prepare prepare
    [ $failed = 0 ] && molecule_all "$@"
    ;;
  *) echo "usage: $0 [all|lint|unit|bench|prepare|molecule [scenario...]]" >&2; exit 2 ;;
esac

# Failures again at the end of the output, where a truncated log still shows them.
for digest in $digests; do
  note "what failed: $digest"
  cat ".cache/logs/failures-$digest.txt"
done

elapsed=$(( $(date +%s) - started ))
if [ $failed = 0 ]; then
  printf '\nTEST SUMMARY: PASSED in %dm%02ds —%s\n' $((elapsed / 60)) $((elapsed % 60)) "$results"
else
  printf '\nTEST SUMMARY: FAILED in %dm%02ds —%s\n' $((elapsed / 60)) $((elapsed % 60)) "$results"
fi
exit $failed
