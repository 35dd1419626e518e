#!/bin/sh
# Prepare this machine (Debian 12+, as root) for the lab and the tests. Idempotent; safe to re-run.
#  - host packages: podman + runc (systemd containers), debootstrap, make, ...
#  - a containers.conf drop-in: runc as the OCI runtime (crun refuses hybrid cgroups) and ulimits the kernel allows
#  - .venv with the pinned Python tooling (requirements-dev.txt), rebuilt only when a requirements file changes
#  - collections/ from the offline bundle when one is present (files/bundle/collections), once the bundle verifies
#    (signature, SHA256SUMS, every file: scripts/bundle-tool.py verify)
set -eu
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (it installs packages and configures podman)" >&2
  exit 1
fi

# Container name resolution (every multi-host scenario and the lab need it) comes from the DNS provider of the
# network backend podman uses; podman pulls in neither by itself:
#  - netavark + aardvark-dns (in scripts/host-packages.txt): what podman 4 picks on a machine that has no containers yet, and the only backend of
#    podman 5 (Debian 13), so the lab behaves the same on both;
#  - a machine whose podman already runs on CNI keeps that backend (podman records its choice; switching needs
#    `podman system reset`, which would delete the site's own containers and images): there the CNI dnsname plugin
#    is what resolves names, so it is installed too.
# scripts/doctor.py proves the result: two containers on a podman network resolve each other by name.
packages=$(grep -v '^#' scripts/host-packages.txt)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
apt_install() {
  say "installing: $*"
  [ -n "${apt_updated:-}" ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
missing=""
for pkg in $packages; do
  installed "$pkg" || missing="$missing $pkg"
done
# shellcheck disable=SC2086
[ -z "$missing" ] || apt_install $missing
if [ "$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null)" = cni ] &&
   ! installed golang-github-containernetworking-plugin-dnsname; then
  apt_install golang-github-containernetworking-plugin-dnsname
fi

dropin=/etc/containers/containers.conf.d/50-hpcobs.conf
want='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]

[engine]
runtime = "runc"'
if [ "$(cat "$dropin" 2>/dev/null)" != "$want" ]; then
  mkdir -p "$(dirname "$dropin")"
  printf '%s\n' "$want" >"$dropin"
  say "wrote $dropin"
fi

python=${PYTHON:-python3}
stamp=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)
if [ "$(cat .venv/.hpcobs-stamp 2>/dev/null)" != "$stamp" ]; then
  say "creating .venv with the pinned tooling ($($python --version))"
  rm -rf .venv
  "$python" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
  echo "$stamp" >.venv/.hpcobs-stamp
fi

bundle=${HPCOBS_BUNDLE_DIR:-files/bundle}
if ls "$bundle"/collections/*.tar.gz >/dev/null 2>&1; then
  verified=""
  for tarball in "$bundle"/collections/*.tar.gz; do
    name=$(basename "$tarball" .tar.gz)
    [ -f "collections/.installed-$name" ] && continue
    if [ -z "$verified" ]; then
      if ! python3 scripts/bundle-tool.py verify "$bundle" >/dev/null; then
        say "WARNING: $bundle does not verify (above): no collection installed from it"
        break
      fi
      verified=1
    fi
    .venv/bin/ansible-galaxy collection install --offline --force -p collections "$tarball" >/dev/null
    touch "collections/.installed-$name"
    say "installed collection $name from the bundle"
  done
fi
say "ready"
