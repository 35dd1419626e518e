#!/usr/bin/env python3
"""Make the test bundle: a copy of a real bundle plus STAND-INS for components that cannot be had here.

molecule/standins/<component>/ holds one file per binary of files/artifacts.yml, optionally tree/ (the rest of the
archive root) and MODULES (repository paths, one a line, of the modules the stand-in imports: the binary is then a
zip application). The archives, in the upstream layout, go into a hard-linked copy of the bundle with
"standin": true in manifest.json; a component the source bundle has for real is never replaced. SHA256SUMS is
rewritten and signed with the local throw-away key (.cache/signing/bundle-key, made by scripts/bundle.sh local).

    build-test-bundle.py --from .cache/bundle-local/bundle --to .cache/bundle-test/bundle [--key KEY]
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "local-mirror"))

import yaml  # noqa: E402

from build import pack, sha256_file  # noqa: E402  (the local mirror's reproducible packer)


def modules(component):
    """[(path, module file name)] of a stand-in's MODULES (one repository path a line)."""
    listing = os.path.join(HERE, component, "MODULES")
    lines = open(listing, encoding="utf-8").read().split() if os.path.exists(listing) else []
    return [(os.path.join(ROOT, path), os.path.basename(path)) for path in lines]


def members(component, spec, fmt):
    root = spec.get("archive_root", "").format(**fmt)
    out = []
    for base, _, files in os.walk(os.path.join(HERE, component, "tree")):
        for name in sorted(files):
            path = os.path.join(base, name)
            with open(path, "rb") as handle:
                out.append((os.path.relpath(path, os.path.join(HERE, component, "tree")), handle.read(),
                            0o755 if os.access(path, os.X_OK) else 0o644))
    for installed, inner in spec["binaries"].items():
        with open(os.path.join(HERE, component, installed), "rb") as handle:
            data = handle.read()
        if modules(component):  # a reproducible zip application
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for name, content in [("__main__.py", data)] + [(n, open(p, "rb").read()) for p, n in
                                                                 modules(component)]:
                    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                    info.external_attr, info.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
                    archive.writestr(info, content)
            data = b"#!/usr/bin/env python3\n" + buffer.getvalue()
        out.append((inner.format(**fmt), data, 0o755))
    out.append(("STAND-IN.txt", ("STAND-IN: this is not %s. It is hpcobs' test stand-in (molecule/standins/%s), packed "
                                 "in the layout of the upstream release.\n" % (component, component)).encode(), 0o644))
    return [("%s/%s" % (root, name) if root else name, data, mode) for name, data, mode in out]


def inputs_key(src, key):
    """What the test bundle depends on: the source manifest, the catalog, this script and every stand-in file."""
    paths = [os.path.join(src, "manifest.json"), os.path.join(ROOT, "files", "artifacts.yml"),
             os.path.abspath(__file__), key + ".pub"]
    for base, dirs, files in os.walk(HERE):
        dirs.sort()
        paths += [os.path.join(base, n) for n in sorted(files) if not n.endswith(".pyc")]
        paths += [path for path, _ in modules(os.path.relpath(base, HERE))]
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            digest.update(path.encode() + handle.read())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="src", required=True)
    parser.add_argument("--to", dest="dst", required=True)
    parser.add_argument("--key", default=os.path.join(ROOT, ".cache", "signing", "bundle-key"),
                        help="signing key of the test bundle")
    args = parser.parse_args()
    src, dst = os.path.abspath(args.src), os.path.abspath(args.dst)
    key, stamp = inputs_key(src, args.key), os.path.join(os.path.dirname(dst), ".hpcobs-test-bundle-key")
    if os.path.exists(os.path.join(dst, "manifest.json")) and os.path.exists(stamp) and \
            open(stamp, encoding="utf-8").read().strip() == key:
        return print("stand-in: test bundle %s is up to date" % dst)
    with open(os.path.join(src, "manifest.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    with open(os.path.join(ROOT, "files", "artifacts.yml"), encoding="utf-8") as handle:
        catalog = yaml.safe_load(handle)
    tmp = dst + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=os.link, ignore=lambda d, names: [
        n for n in names if d == src and n in ("manifest.json", "SHA256SUMS", "SHA256SUMS.sig")])
    added = []
    for component in sorted(c for c in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, c)) and c[0] not in "_."):
        if component in manifest["components"]:
            print("stand-in: %s is in the bundle for real, not replaced" % component)
            continue
        spec, files = catalog["components"][component], {}
        for arch in manifest.get("archs", catalog["archs"]):
            fmt = {"version": str(spec["version"]), "arch": arch}
            path = "artifacts/%s/%s/%s" % (component, fmt["version"], spec["url"].format(**fmt).rsplit("/", 1)[-1])
            pack(os.path.join(tmp, path), members(component, spec, fmt))
            files[arch] = {"path": path, "sha256": sha256_file(os.path.join(tmp, path)), "upstream_url": "",
                           "archive_root": spec.get("archive_root", "").format(**fmt),
                           "binaries": {k: v.format(**fmt) for k, v in sorted(spec["binaries"].items())},
                           "install_tree": bool(spec.get("install_tree", False)), "standin": True}
        manifest["components"][component] = {"version": str(spec["version"]), "files": files, "standin": True}
        manifest["missing"] = [m for m in manifest.get("missing", []) if m.get("component") != component]
        added.append(component)
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    with open(os.path.join(tmp, "manifest.json"), "wb") as handle:
        handle.write(data)
    sums = [(item["path"], item["sha256"]) for entry in manifest["components"].values()
            for item in entry["files"].values()]
    sums += [(item["path"], item["sha256"]) for section in ("dashboards", "collections")
             for item in manifest.get(section, {}).values()]
    with open(os.path.join(tmp, "SHA256SUMS"), "w", encoding="utf-8") as handle:
        handle.writelines("%s  %s\n" % (digest, path) for path, digest in sorted(
            sums + [("manifest.json", hashlib.sha256(data).hexdigest())]))
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bundle-tool.py"), "sign", tmp, "--key", args.key],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(dst, ignore_errors=True)
    os.rename(tmp, dst)
    with open(stamp, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    print("stand-in: test bundle %s = %s + stand-ins for %s" % (dst, src, ", ".join(added) or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
