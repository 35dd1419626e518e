#!/usr/bin/env python3
"""Make the test bundle: a copy of a real bundle plus STAND-INS for components that cannot be had here.

Grafana, Loki and Promtail have no Debian package and their release hosts are unreachable from the test machines,
so a bundle built from the local mirror lacks them. For the Molecule scenarios this script packs the stand-ins of
molecule/standins/<component>/ in the archive layout files/artifacts.yml describes for that component and adds them
to a copy of the bundle (files are hard-linked, manifest.json and SHA256SUMS are rewritten), so the roles install
them through their real code path: artifact verification, unpacking, copy, unit, config validation, readiness.

Manifest entries of stand-ins carry "standin": true. A component that the source bundle already has (a real
binary, e.g. from a bundle built on a connected machine) is never replaced.

Stand-in layout, molecule/standins/<component>/:
    <installed name>   one file per binary of files/artifacts.yml (e.g. loki), packed at its path in the archive
    tree/              optional: the rest of the archive root (install_tree components such as Grafana)
    MODULES            optional: Python files (paths relative to the repository, "<path> as <module>.py" to name
                       one) the stand-in imports; the binary
                       is then packed as a zip application (shebang + zip: __main__.py and those modules), so one
                       file still installs as the binary and code shared with a role is not copied

    build-test-bundle.py --from .cache/bundle-local/bundle --to .cache/bundle-test/bundle [--key KEY]

The rewritten SHA256SUMS is signed with the local throw-away key (.cache/signing/bundle-key, made by
scripts/bundle.sh local), so the tests run with signature verification on.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "local-mirror"))

import yaml  # noqa: E402

from build import pack, sha256_file  # noqa: E402  (the local mirror's reproducible packer)


def standin_members(component, spec, version, arch):
    source = os.path.join(HERE, component)
    fmt = {"version": version, "arch": arch}
    root = spec.get("archive_root", "").format(**fmt)
    members = []
    tree = os.path.join(source, "tree")
    if os.path.isdir(tree):
        for base, _, files in os.walk(tree):
            for name in sorted(files):
                path = os.path.join(base, name)
                rel = os.path.relpath(path, tree)
                with open(path, "rb") as handle:
                    data = handle.read()
                mode = 0o755 if os.access(path, os.X_OK) else 0o644
                members.append(("%s/%s" % (root, rel) if root else rel, data, mode))
    modules_list = os.path.join(source, "MODULES")
    for installed, inner in spec["binaries"].items():
        path = os.path.join(source, installed)
        with open(path, "rb") as handle:
            data = handle.read()
        if os.path.exists(modules_list):
            data = zipapp(data, modules_list)
        inner = inner.format(**fmt)
        members.append(("%s/%s" % (root, inner) if root else inner, data, 0o755))
    note = ("STAND-IN: this is not %s. It is hpcobs' test stand-in (molecule/standins/%s), packed in the layout\n"
            "of the upstream release so the role's real install path can be tested where the real binary cannot be\n"
            "had.\n" % (component, component)).encode()
    members.append(("%s/STAND-IN.txt" % root if root else "STAND-IN.txt", note, 0o644))
    return members


def zipapp(main, modules_list):
    """A reproducible Python zip application: the stand-in as __main__.py plus the modules MODULES names."""
    import io
    import zipfile
    members = [("__main__.py", main)]
    with open(modules_list, encoding="utf-8") as handle:
        for line in handle:
            rel, _, name = line.split("#")[0].strip().partition(" as ")
            if rel:
                with open(os.path.join(ROOT, rel.strip()), "rb") as module:
                    members.append((name.strip() or os.path.basename(rel.strip()), module.read()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return b"#!/usr/bin/env python3\n" + buffer.getvalue()


def link_tree(src, dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    for base, dirs, files in os.walk(src):
        rel = os.path.relpath(base, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for name in files:
            if rel == "." and name in ("manifest.json", "SHA256SUMS", "SHA256SUMS.sig"):
                continue
            os.link(os.path.join(base, name), os.path.join(dst, rel, name))


def inputs_key(src, key):
    """What the test bundle depends on: the source manifest, the catalog, this script and every stand-in file."""
    digest = hashlib.sha256()
    paths = [os.path.join(src, "manifest.json"), os.path.join(ROOT, "files", "artifacts.yml"), os.path.abspath(__file__),
             key + ".pub"]
    for base, dirs, files in os.walk(HERE):
        dirs.sort()
        paths += [os.path.join(base, name) for name in sorted(files) if not name.endswith(".pyc")]
        if "MODULES" in files:
            with open(os.path.join(base, "MODULES"), encoding="utf-8") as handle:
                paths += [os.path.join(ROOT, line.split("#")[0].partition(" as ")[0].strip()) for line in handle
                          if line.split("#")[0].strip()]
    for path in paths:
        digest.update(path.encode())
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="src", required=True)
    parser.add_argument("--to", dest="dst", required=True)
    parser.add_argument("--key", default=os.path.join(ROOT, ".cache", "signing", "bundle-key"),
                        help="signing key of the test bundle")
    args = parser.parse_args()
    src, dst = os.path.abspath(args.src), os.path.abspath(args.dst)
    key = inputs_key(src, args.key)
    stamp = os.path.join(os.path.dirname(dst), ".hpcobs-test-bundle-key")
    if os.path.exists(os.path.join(dst, "manifest.json")) and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as handle:
            if handle.read().strip() == key:
                print("stand-in: test bundle %s is up to date" % dst)
                return 0
    with open(os.path.join(src, "manifest.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    with open(os.path.join(ROOT, "files", "artifacts.yml"), encoding="utf-8") as handle:
        catalog = yaml.safe_load(handle)
    tmp = dst + ".new"
    link_tree(src, tmp)
    added = []
    for component in sorted(os.listdir(HERE)):
        if not os.path.isdir(os.path.join(HERE, component)) or component.startswith(("_", ".")):
            continue
        if component in manifest["components"]:
            print("stand-in: %s is in the bundle for real, not replaced" % component)
            continue
        spec = catalog["components"][component]
        version = str(spec["version"])
        files = {}
        for arch in manifest.get("archs", catalog["archs"]):
            fmt = {"version": version, "arch": arch}
            filename = spec["url"].format(**fmt).rsplit("/", 1)[-1]
            path = "artifacts/%s/%s/%s" % (component, version, filename)
            pack(os.path.join(tmp, path), standin_members(component, spec, version, arch))
            files[arch] = {
                "path": path,
                "sha256": sha256_file(os.path.join(tmp, path)),
                "upstream_url": "",
                "archive_root": spec.get("archive_root", "").format(**fmt),
                "binaries": {k: v.format(**fmt) for k, v in sorted(spec["binaries"].items())},
                "install_tree": bool(spec.get("install_tree", False)),
                "standin": True,
            }
        manifest["components"][component] = {"version": version, "files": files, "standin": True}
        manifest["missing"] = [m for m in manifest.get("missing", []) if m.get("component") != component]
        added.append(component)
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    with open(os.path.join(tmp, "manifest.json"), "wb") as handle:
        handle.write(data)
    lines = []
    for entry in manifest["components"].values():
        for item in entry["files"].values():
            lines.append((item["path"], item["sha256"]))
    for section in ("dashboards", "collections"):
        for item in manifest.get(section, {}).values():
            lines.append((item["path"], item["sha256"]))
    lines.append(("manifest.json", hashlib.sha256(data).hexdigest()))
    with open(os.path.join(tmp, "SHA256SUMS"), "w", encoding="utf-8") as handle:
        handle.writelines("%s  %s\n" % (digest, path) for path, digest in sorted(lines))
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bundle-tool.py"), "sign", tmp, "--key", args.key],
                   check=True, stdout=subprocess.DEVNULL)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.rename(tmp, dst)
    with open(stamp, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    print("stand-in: test bundle %s = %s + stand-ins for %s" % (dst, src, ", ".join(added) or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
