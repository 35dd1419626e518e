#!/bin/sh
# The lab: a simulated GPU cluster in podman containers on this machine, deployed by the same playbooks as a site.
#
#   scripts/lab.sh up                       build what is missing, start mgmt01 slurmctl01 gpu01 gpu02, run site.yml
#   scripts/lab.sh down                     remove the containers and their network
#   scripts/lab.sh status                   what runs and where
#   scripts/lab.sh fault NODE GPU KIND [CODE]   inject a simulated GPU fault (KIND clear removes faults)
#   scripts/lab.sh jobs                     submit a mix of Slurm jobs across two accounts
#   scripts/lab.sh report                   hpcobs-report (month to date) and the executive board as PNG files
#
# Every service is published on 127.0.0.1 only. The bundle comes from files/bundle when one is there (built with
# make bundle on a connected machine), else from upstream, else from the local mirror (.cache/bundle-local).
set -eu
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg"

network=hpcobs-lab
prefix=hpcobs-lab-
hosts="mgmt01 slurmctl01 gpu01 gpu02"
state=.cache/lab
mkdir -p "$state"

say() { printf 'lab: %s\n' "$*"; }

# host: published ports "hostport:containerport ..." (127.0.0.1 only), from the components map
ports() {
  python3 scripts/lab-endpoints.py ports "$1"
}

# host_port HOST CONTAINERPORT: the 127.0.0.1 port published for it (from ports above)
host_port() {
  for pair in $(ports "$1"); do
    [ "${pair#*:}" = "$2" ] && { echo "${pair%%:*}"; return 0; }
  done
  echo "lab: $1 publishes no port $2" >&2
  return 1
}

choose_bundle() {
  if [ -n "${HPCOBS_BUNDLE_DIR:-}" ] && [ -f "$HPCOBS_BUNDLE_DIR/manifest.json" ]; then
    echo "$HPCOBS_BUNDLE_DIR"
  elif [ -f files/bundle/manifest.json ]; then
    echo "$root/files/bundle"
  elif scripts/bundle.sh upstream >"$state/bundle-upstream.log" 2>&1; then
    echo "$root/files/bundle"
  else
    say "upstream release hosts unreachable (see $state/bundle-upstream.log); using the local mirror" >&2
    scripts/bundle.sh local >"$state/bundle-local.log" 2>&1 || { tail -30 "$state/bundle-local.log" >&2; exit 1; }
    echo "$root/.cache/bundle-local/bundle"
  fi
}

# Components the bundle lacks: deployed by nothing, said out loud.
missing_components() {
  python3 - "$1" <<'PY'
import json, sys
manifest = json.load(open(sys.argv[1] + "/manifest.json"))
wanted = ["node_exporter", "ipmi_exporter", "smartctl_exporter", "promtail", "victoriametrics", "vmutils",
          "alertmanager", "loki", "grafana"]
role = {"vmutils": "vmalert"}
print(" ".join(sorted({role.get(c, c) for c in wanted if c not in manifest["components"]})))
PY
}

create() {
  podman network exists "$network" || podman network create "$network" >/dev/null
  for host in $hosts; do
    name=$prefix$host
    if podman container exists "$name"; then
      [ "$(podman inspect -f '{{.State.Running}}' "$name")" = true ] || podman start "$name" >/dev/null
      continue
    fi
    image=localhost/hpcobs-debian12
    publish=""
    for pair in $(ports "$host"); do
      publish="$publish -p 127.0.0.1:$pair"
    done
    caps="--cap-add SYS_ADMIN"
    case "$host" in gpu*) caps="$caps --cap-add MKNOD" ;; esac
    # shellcheck disable=SC2086
    podman run -d --name "$name" --hostname "$host" --network "$network" --network-alias "$host" \
      --systemd=always $caps $publish --label hpcobs.lab=1 "$image" /sbin/init >/dev/null
    say "started $name"
  done
  for host in $hosts; do
    podman exec "$prefix$host" systemctl is-system-running --wait >/dev/null 2>&1 || true
  done
}

up() {
  t0=$(date +%s)
  python3 scripts/doctor.py   # builds the debian12 image when missing
  scripts/build-images.sh debian12
  bundle=$(choose_bundle)
  export HPCOBS_BUNDLE_DIR="$bundle"
  # A local-mirror bundle is signed by this machine's throw-away key; a carried one by a key the site trusts.
  if [ -z "${HPCOBS_BUNDLE_ALLOWED_SIGNERS:-}" ] && [ "$bundle" = "$root/.cache/bundle-local/bundle" ]; then
    export HPCOBS_BUNDLE_ALLOWED_SIGNERS="$root/.cache/signing/allowed_signers"
  fi
  disabled=$(missing_components "$bundle")
  echo "$bundle" >"$state/bundle"
  echo "$disabled" >"$state/disabled"
  say "bundle: $bundle"
  [ -z "$disabled" ] || say "the bundle lacks: $disabled (not deployed; build a full bundle with 'make bundle' on a connected machine)"
  create
  json=$(python3 -c 'import json,sys; print(json.dumps({"hpcobs_components_disabled": sys.argv[1:]}))' $disabled)
  ansible-playbook -i inventories/lab playbooks/lab.yml -e "$json" | tee "$state/site.log" | grep -E '^(PLAY|TASK \[.*(Summary|Wait)|fatal|.*failed=[1-9])' || true
  if grep -qE 'failed=[1-9]|unreachable=[1-9]' "$state/site.log" || ! grep -q 'PLAY RECAP' "$state/site.log"; then
    say "the deployment failed; the full log is $state/site.log"
    exit 1
  fi
  say "deployed in $(( $(date +%s) - t0 ))s"
  status
}

status() {
  printf '\n%-12s %-24s %s\n' HOST CONTAINER STATE
  for host in $hosts; do
    name=$prefix$host
    st=$(podman inspect -f '{{.State.Status}}' "$name" 2>/dev/null || echo absent)
    printf '%-12s %-24s %s\n' "$host" "$name" "$st"
  done
  printf '\nEndpoints (127.0.0.1 only):\n'
  python3 scripts/lab-endpoints.py status "$(cat "$state/disabled" 2>/dev/null || true)"
}

down() {
  for host in $hosts; do
    podman rm -f -t 5 "$prefix$host" >/dev/null 2>&1 && say "removed $prefix$host" || true
  done
  podman network exists "$network" && podman network rm "$network" >/dev/null && say "removed network $network" || true
  rm -rf "$state"
}

fault() {
  node=${1:?node}; gpu=${2:?gpu}; kind=${3:?kind}; code=${4:-}
  name=$prefix$node
  podman container exists "$name" || { echo "lab: no such lab host $node (hosts: $hosts)" >&2; exit 2; }
  if [ "$kind" = clear ]; then
    podman exec "$name" hpcobs-gpusim fault clear --gpu "$gpu"
  elif [ -n "$code" ]; then
    podman exec "$name" hpcobs-gpusim fault set --gpu "$gpu" "$kind" --code "$code"
  else
    podman exec "$name" hpcobs-gpusim fault set --gpu "$gpu" "$kind"
  fi
  podman exec "$name" hpcobs-gpusim fault list
}

jobs() {
  podman exec "${prefix}slurmctl01" hpcobs-lab-jobs
}

# The report and the executive board from the lab's VictoriaMetrics, no Grafana needed: with the security switch on
# (the lab's default), through its read-only front (mgmt01 port 8427) as the Slurm hosts' tools reach it, trusting the
# lab's site CA, with the reader credential (a settings file like /etc/hpcobs/jobstats.conf, in the lab's state);
# with it off, VictoriaMetrics itself (port 8428) over plain HTTP.
report() {
  out=.cache/lab-report
  mkdir -p "$out"
  conf=$state/jobstats.conf
  python3 scripts/lab-endpoints.py jobstats-conf >"$conf"
  export HPCOBS_JOBSTATS_CONF="$root/$conf"
  tool=roles/slurm_metrics/files/hpcobs-report
  python3 "$tool" --month-to-date --out-dir "$out" >/dev/null
  python3 "$tool" board --out-dir "$out" --range 24h >/dev/null
  say "wrote into $out:"
  for file in "$out"/hpcobs-*; do
    printf '  %s  %s bytes\n' "$file" "$(wc -c <"$file")"
  done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  fault) fault "$@" ;;
  jobs) jobs ;;
  report) report ;;
  *) echo "usage: $0 up|down|status|fault NODE GPU KIND [CODE]|jobs|report" >&2; exit 2 ;;
esac
