#!/usr/bin/env python3
"""Pack an installed Ansible collection into the tarball format ansible-galaxy installs from.

Used by playbooks/bundle.yml when Galaxy cannot be reached. An installed collection keeps its MANIFEST.json and
FILES.json; some distributions of it (the "ansible" Python package) leave out directories such as tests/. The
tarball gets every file FILES.json lists that is present, each checked against its recorded sha256, and a FILES.json
(and its checksum in MANIFEST.json) trimmed to those files, so `ansible-galaxy collection install --offline`
accepts it and `ansible-galaxy collection verify --offline` passes on the result.
"""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def pack(src, dest, name, version):
    with open(os.path.join(src, "MANIFEST.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    info = manifest["collection_info"]
    found = "%s.%s" % (info["namespace"], info["name"])
    if found != name or str(info["version"]) != str(version):
        raise SystemExit("%s holds %s %s, not %s %s" % (src, found, info["version"], name, version))
    with open(os.path.join(src, "FILES.json"), encoding="utf-8") as handle:
        files_json = json.load(handle)
    kept = []
    for entry in files_json["files"]:
        path = os.path.join(src, entry["name"])
        if entry["name"] in (".", "") or not os.path.lexists(path):
            continue
        if entry["ftype"] == "file" and entry.get("chksum_sha256") and _sha256(path) != entry["chksum_sha256"]:
            raise SystemExit("%s: %s does not match the sha256 recorded in FILES.json" % (src, entry["name"]))
        kept.append(entry)
    files_json["files"] = kept
    files_data = json.dumps(files_json, indent=4).encode("utf-8")
    manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(files_data).hexdigest()
    tmp = dest + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        _add_bytes(tar, "MANIFEST.json", json.dumps(manifest, indent=4).encode("utf-8"))
        _add_bytes(tar, "FILES.json", files_data)
        for entry in kept:
            tar.add(os.path.join(src, entry["name"]), arcname=entry["name"], recursive=False)
    os.replace(tmp, dest)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True, help="installed collection directory (holds MANIFEST.json)")
    parser.add_argument("--dest", required=True, help="tarball to write")
    parser.add_argument("--name", required=True, help="namespace.name expected in MANIFEST.json")
    parser.add_argument("--version", required=True, help="version expected in MANIFEST.json")
    args = parser.parse_args()
    pack(args.src, args.dest, args.name, args.version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
