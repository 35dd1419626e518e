#!/bin/sh
# Build the systemd test-host images (localhost/hpcobs-debian12, localhost/hpcobs-debian13) with debootstrap from
# the Debian mirror this machine's apt uses, and import them into podman.
#
# An image is rebuilt only when its inputs change (this script, the suite, the package list, the mirror): the key
# of those inputs is stored as the image label hpcobs.key. Both suites build in parallel.
#
#   scripts/build-images.sh            # both
#   scripts/build-images.sh debian12   # one
set -eu
cd "$(dirname "$0")/.."

mirror=$(python3 scripts/debian-mirror.py)
packages=systemd,systemd-sysv,dbus,python3,python3-apt,python3-yaml,iproute2,procps,ca-certificates,gnupg,less,curl
all="debian12:bookworm debian13:trixie"
wanted=${*:-debian12 debian13}

build() {
  name=$1 suite=$2
  image=localhost/hpcobs-$name
  key=$( (cat "$0"; printf '%s\n' "$mirror" "$suite" "$packages") | sha256sum | cut -c1-20)
  current=$(podman image inspect --format '{{ index .Labels "hpcobs.key" }}' "$image" 2>/dev/null || true)
  if [ "$current" = "$key" ]; then
    echo "build-images: $image is up to date"
    return 0
  fi
  rootfs=$(mktemp -d /var/tmp/hpcobs-rootfs-"$name".XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  echo "build-images: debootstrap $suite from $mirror ..."
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
    tail -20 "$rootfs.log" >&2; echo "build-images: debootstrap $suite failed" >&2; exit 1; }
  rm -f "$rootfs.log"
  # A test host behaves like a lean server: no recommends, no docs, a fresh machine-id on every boot.
  cat >"$rootfs/etc/apt/apt.conf.d/90hpcobs-test-host" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Retries "3";
EOF
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/90hpcobs-test-host" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
path-include /usr/share/doc/*/copyright
EOF
  : >"$rootfs/etc/machine-id"
  rm -f "$rootfs/var/lib/dbus/machine-id"
  # Units that have nothing to do in a container.
  for unit in getty@tty1.service systemd-remount-fs.service systemd-firstboot.service; do
    ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
  done
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*_Packages
  tar -C "$rootfs" -c . | podman import --quiet \
    --change "LABEL hpcobs.key=$key" --change "LABEL hpcobs.suite=$suite" \
    --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' - "$image" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  echo "build-images: built $image ($suite)"
}

pids=""
for name in $wanted; do
  suite=""
  for entry in $all; do
    [ "${entry%%:*}" = "$name" ] && suite=${entry#*:}
  done
  [ -n "$suite" ] || { echo "build-images: unknown image $name (known: $all)" >&2; exit 2; }
  build "$name" "$suite" &
  pids="$pids $!"
done
status=0
for pid in $pids; do
  wait "$pid" || status=1
done
exit $status
