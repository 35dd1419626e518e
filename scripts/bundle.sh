#!/bin/sh
# Build an offline bundle.
#   scripts/bundle.sh upstream [ansible-playbook args]   from the upstream release hosts (connected machine)
#   scripts/bundle.sh local    [ansible-playbook args]   from the local mirror (Debian packages repacked in the
#                                                         upstream layout; see scripts/local-mirror/build.py), on
#                                                         127.0.0.1 over http, pinned with the mirror's own pins
#                                                         (.cache/mirror/pins.yml) and signed with this machine's
#                                                         throw-away key (.cache/signing)
# The local bundle goes to .cache/bundle-local/bundle (files/bundle is left alone) and is partial by nature:
# components without a Debian package, the grafana.com dashboards and Galaxy are not reachable from it.
set -eu
cd "$(dirname "$0")/.."
mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  upstream)
    exec ansible-playbook playbooks/bundle.yml "$@"
    ;;
  local)
    mkdir -p .cache
    exec 8>.cache/bundle-local.lock
    flock 8    # one builder at a time on this machine
    python3 scripts/local-mirror/build.py mirror --out .cache/mirror
    # A throw-away signing key of this machine for the local bundles (the tests and the lab trust it through
    # HPCOBS_BUNDLE_ALLOWED_SIGNERS=.cache/signing/allowed_signers); never a site's key, never committed.
    if [ ! -f .cache/signing/bundle-key ]; then
      mkdir -p .cache/signing
      python3 scripts/bundle-tool.py keygen .cache/signing/bundle-key --principal hpcobs-local-test \
        >.cache/signing/allowed_signers.new
      mv .cache/signing/allowed_signers.new .cache/signing/allowed_signers
    fi
    # Rebuild only when an input changed (the mirror, the playbook and its code, requirements.yml, the arguments).
    key=$( (cat .cache/mirror/.hpcobs-inputs-mirror playbooks/bundle.yml playbooks/filter_plugins/*.py \
            requirements.yml scripts/pack-collection.py scripts/bundle-tool.py .cache/signing/bundle-key.pub; echo "$*") | sha256sum | cut -c1-20)
    if [ -f .cache/bundle-local/bundle/manifest.json ] && [ "$(cat .cache/bundle-local/.key 2>/dev/null)" = "$key" ]; then
      echo "bundle: .cache/bundle-local/bundle is up to date"
      exit 0
    fi
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 -m http.server --bind 127.0.0.1 --directory .cache/mirror "$port" >.cache/mirror-server.log 2>&1 &
    server=$!
    trap 'kill $server 2>/dev/null || true' EXIT INT TERM
    python3 - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(50):
    try:
        urllib.request.urlopen("http://127.0.0.1:%s/" % sys.argv[1], timeout=1)
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("local mirror server did not start")
PY
    mkdir -p .cache/bundle-local
    ansible-playbook playbooks/bundle.yml \
      -e "hpcobs_bundle_base_url=http://127.0.0.1:$port" \
      -e "hpcobs_bundle_dir=$PWD/.cache/bundle-local/bundle" \
      -e "hpcobs_bundle_archive=$PWD/.cache/bundle-local/hpcobs-bundle-local.tar.gz" \
      -e "hpcobs_bundle_signing_key=$PWD/.cache/signing/bundle-key" \
      -e "hpcobs_bundle_pins=$PWD/.cache/mirror/pins.yml" \
      -e '{"hpcobs_bundle_allow_http": true}' \
      -e '{"hpcobs_bundle_allow_missing": true}' "$@"
    echo "$key" >.cache/bundle-local/.key
    ;;
  *)
    echo "usage: $0 upstream|local [ansible-playbook args]" >&2
    exit 2
    ;;
esac
