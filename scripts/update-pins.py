#!/usr/bin/env python3
"""Move a component of files/artifacts.yml to another version and pin its archives' sha256, showing the diff.

    scripts/update-pins.py node_exporter 1.11.2                       fetch the upstream checksum file (https)
    scripts/update-pins.py node_exporter 1.11.2 --checksums sums.txt  or read it from a file fetched another way
    ... --write                                                        apply the change (default: only show it)

For each architecture the component is published for, the sha256 of its archive is taken from the upstream checksum
file (checksum.url of the component, at the new version) and written as checksum.sha256 next to it; the version line
changes too. Compare the printed hashes with the release page (or a second source) before writing: from then on the
pin, not the checksum file, decides what `make bundle` accepts, and the checksum file only cross-checks it.
"""
import argparse
import difflib
import os
import re
import sys
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def sha_for(text, filename):
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[-1].lstrip("*").rsplit("/", 1)[-1] == filename and SHA256.match(fields[0].lower()):
            return fields[0].lower()
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and len(lines[0]) == 1 and SHA256.match(lines[0][0].lower()):
        return lines[0][0].lower()
    return None


def fetch(url, allow_http):
    if not url.startswith("https://") and not allow_http:
        raise SystemExit("update-pins: %s is not https (--allow-http for a mirror you trust)" % url)
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode("utf-8", "replace")


def new_text(text, component, version, pins):
    """files/artifacts.yml text with component's version and checksum.sha256 replaced; comments kept."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "  %s:" % component), None)
    if start is None:
        raise SystemExit("update-pins: files/artifacts.yml has no component %s" % component)
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^(  \S|\S)", lines[i])), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    block = lines[start:end]
    out, i, pinned = [], 0, False
    pin_lines = ["      sha256:\n"] + ['        %s: "%s"\n' % (arch, digest) for arch, digest in sorted(pins.items())]
    while i < len(block):
        line = block[i]
        if re.match(r"^    version: ", line):
            out.append('    version: "%s"\n' % version)
        elif line.rstrip() == "      sha256:":
            i += 1
            while i < len(block) and block[i].startswith("        "):
                i += 1
            out.extend(pin_lines)
            pinned = True
            continue
        elif line.rstrip() == "    checksum:":
            out.append(line)
            i += 1
            while i < len(block) and block[i].startswith("      ") and block[i].rstrip() != "      sha256:":
                out.append(block[i])
                i += 1
            if i >= len(block) or block[i].rstrip() != "      sha256:":
                out.extend(pin_lines)
                pinned = True
            continue
        else:
            out.append(line)
        i += 1
    if not pinned:
        raise SystemExit("update-pins: component %s has no checksum: block to pin" % component)
    return "".join(lines[:start] + out + lines[end:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("component")
    parser.add_argument("version")
    parser.add_argument("--checksums", help="the upstream checksum file, already fetched (default: fetch it)")
    parser.add_argument("--catalog", default=os.path.join(ROOT, "files", "artifacts.yml"))
    parser.add_argument("--allow-http", action="store_true")
    parser.add_argument("--write", action="store_true", help="apply the change")
    args = parser.parse_args()
    with open(args.catalog, encoding="utf-8") as handle:
        text = handle.read()
    catalog = yaml.safe_load(text)
    spec = (catalog.get("components") or {}).get(args.component)
    if not spec:
        raise SystemExit("update-pins: files/artifacts.yml has no component %s" % args.component)
    if not re.match(r"^[0-9A-Za-z][0-9A-Za-z._+~-]*$", args.version) or ".." in args.version:
        raise SystemExit("update-pins: bad version %r" % args.version)
    checksum_url = (spec.get("checksum") or {}).get("url")
    if not checksum_url and not args.checksums:
        raise SystemExit("update-pins: %s has no checksum.url; give --checksums" % args.component)
    pins, listings = {}, {}
    for arch in spec.get("archs") or catalog.get("archs") or ["amd64", "arm64"]:
        values = {"version": args.version, "arch": arch}
        filename = spec["url"].format(**values).rsplit("/", 1)[-1]
        if args.checksums:
            with open(args.checksums, encoding="utf-8") as handle:
                listing = handle.read()
        else:
            url = checksum_url.format(**values)
            listing = listings.get(url) or listings.setdefault(url, fetch(url, args.allow_http))
        digest = sha_for(listing, filename)
        if not digest:
            raise SystemExit("update-pins: the checksum file has no sha256 for %s" % filename)
        pins[arch] = digest
        print("update-pins: %s %s %s: %s  %s" % (args.component, args.version, arch, digest, filename))
    updated = new_text(text, args.component, args.version, pins)
    check = yaml.safe_load(updated)["components"][args.component]
    assert check["version"] == args.version and check["checksum"]["sha256"] == pins, "edit did not apply"
    sys.stdout.writelines(difflib.unified_diff(text.splitlines(keepends=True), updated.splitlines(keepends=True),
                                               "a/files/artifacts.yml", "b/files/artifacts.yml"))
    if args.write:
        with open(args.catalog + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(updated)
        os.replace(args.catalog + ".tmp", args.catalog)
        print("update-pins: %s written; rebuild the bundle (make bundle) and run make test" % args.catalog)
    else:
        print("update-pins: nothing written (add --write to apply)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
