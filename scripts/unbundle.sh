#!/bin/sh
# Unpack a carried offline bundle into files/bundle, verifying every file before the old bundle is replaced.
#   scripts/unbundle.sh /media/hpcobs-bundle-20261129.tar.gz
# When <tarball>.sha256 sits next to it, the tarball itself is checked first. The collections it carries are then
# installed into collections/ (no network needed).
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
new=files/.bundle.new
rm -rf "$new"
mkdir -p "$new"
tar -C "$new" -xzf "$tarball"
[ -f "$new/bundle/manifest.json" ] || { rm -rf "$new"; echo "unbundle: $tarball holds no bundle/manifest.json" >&2; exit 1; }
if ! (cd "$new/bundle" && sha256sum --check --strict --quiet SHA256SUMS); then
  rm -rf "$new"
  echo "unbundle: a file of the bundle does not match SHA256SUMS; files/bundle was left as it was" >&2
  exit 1
fi
rm -rf files/bundle.old
[ -d files/bundle ] && mv files/bundle files/bundle.old
mv "$new/bundle" files/bundle
rm -rf "$new" files/bundle.old
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
