#!/usr/bin/env python3
"""Print the Debian mirror this machine's apt is configured with (the URI serving Debian's main archive).

Reads /etc/apt/sources.list and /etc/apt/sources.list.d/*.list / *.sources (one-line and deb822 formats) and
prints the first "deb" URI whose suites are a Debian release (not -security, not a third-party repository).
HPCOBS_DEBIAN_MIRROR overrides the answer. Exit 1 with a message when none is found.
"""
import glob
import os
import re
import sys

DEBIAN_SUITES = re.compile(r"^(bookworm|trixie|forky|sid|unstable|testing|stable|oldstable)(-updates|-backports)?$")


def one_line_entries(text):
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)
        fields = line.split()
        if len(fields) >= 3:
            yield fields[1], [fields[2]]


def deb822_entries(text):
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.split()
        if "deb" not in fields.get("types", []) or fields.get("enabled", ["yes"])[0] == "no":
            continue
        for uri in fields.get("uris", []):
            yield uri, fields.get("suites", [])


def find_mirror(root="/"):
    paths = [os.path.join(root, "etc/apt/sources.list")]
    paths += sorted(glob.glob(os.path.join(root, "etc/apt/sources.list.d/*.list")))
    paths += sorted(glob.glob(os.path.join(root, "etc/apt/sources.list.d/*.sources")))
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        entries = deb822_entries(text) if path.endswith(".sources") else one_line_entries(text)
        for uri, suites in entries:
            if any(DEBIAN_SUITES.match(suite) for suite in suites):
                return uri.rstrip("/")
    return None


def main():
    mirror = os.environ.get("HPCOBS_DEBIAN_MIRROR") or find_mirror()
    if not mirror:
        sys.stderr.write("no Debian mirror found in /etc/apt/sources.list{,.d}; set HPCOBS_DEBIAN_MIRROR\n")
        return 1
    print(mirror)
    return 0


if __name__ == "__main__":
    sys.exit(main())
