#!/bin/sh
# Unpack a carried offline bundle into files/bundle, verifying every file before the old bundle is replaced.
#   scripts/unbundle.sh /media/hpcobs-bundle-20261129.tar.gz
#   HPCOBS_BUNDLE_ALLOW_UNSIGNED=yes scripts/unbundle.sh ...   accept an unsigned/unknown bundle (loud; never on a site)
# The tarball is unpacked by scripts/bundle-tool.py, never by tar as root: regular files and directories under
# bundle/ only (links, devices, setuid bits are refused), no owner or mode taken from it. It is accepted only when
# SHA256SUMS.sig verifies with a key of the allowed_signers file (HPCOBS_BUNDLE_ALLOWED_SIGNERS, else
# files/bundle-allowed-signers), SHA256SUMS lists exactly the files unpacked, each with its sha256, and every
# manifest field is safe. A <tarball>.sha256 next to it is checked too (transport damage only: the signature is the
# proof of origin). The collections it carries are then installed into collections/ (no network needed).
set -eu
cd "$(dirname "$0")/.."
tarball=${1:-}
[ -n "$tarball" ] && [ -f "$tarball" ] || { echo "usage: make unbundle BUNDLE=/path/to/hpcobs-bundle-<date>.tar.gz" >&2; exit 2; }
if [ -f "$tarball.sha256" ]; then
  want=$(cut -d' ' -f1 "$tarball.sha256")
  have=$(sha256sum "$tarball" | cut -d' ' -f1)
  [ "$want" = "$have" ] || { echo "unbundle: $tarball has sha256 $have, $tarball.sha256 says $want: not unpacked" >&2; exit 1; }
  echo "unbundle: tarball checksum ok"
fi
override=""
case "${HPCOBS_BUNDLE_ALLOW_UNSIGNED:-}" in
  "") ;;
  yes) override=--allow-unsigned ;;
  *) echo "unbundle: HPCOBS_BUNDLE_ALLOW_UNSIGNED must be 'yes' or unset" >&2; exit 2 ;;
esac
new=files/.bundle.new
rm -rf "$new" "$new.extract"
# shellcheck disable=SC2086
if ! python3 scripts/bundle-tool.py unbundle "$tarball" "$new" $override; then
  rm -rf "$new" "$new.extract"
  echo "unbundle: $tarball refused; files/bundle was left as it was" >&2
  exit 1
fi
rm -rf files/bundle.old
[ -d files/bundle ] && mv files/bundle files/bundle.old
mv "$new" files/bundle
rm -rf files/bundle.old
echo "unbundle: every file verified; files/bundle replaced"
python3 - <<'PY'
import json
m = json.load(open("files/bundle/manifest.json"))
print("unbundle: built %s, archs %s" % (m["created"], ", ".join(m["archs"])))
print("unbundle: components: %s" % ", ".join("%s %s" % (k, v["version"]) for k, v in sorted(m["components"].items())))
if m.get("missing"):
    print("unbundle: MISSING: %s" % ", ".join(sorted({x["component"] for x in m["missing"]})))
PY
rm -f collections/.installed-*
HPCOBS_BUNDLE_DIR=files/bundle scripts/setup.sh
