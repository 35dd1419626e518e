#!/usr/bin/env python3
"""Write the reference part of inventories/example/group_vars: every setting of every role, with its default.

Each group file of the example inventory has two parts. Above the marker line: the site's own settings, written by
hand. Below it: every variable of the roles that run on that group, copied from the roles' defaults with their
comments, commented out (so they document the defaults without overriding them). This script rewrites the part
below the marker; tests/test_inventories.py checks the committed files are up to date.

    python3 scripts/gen-example-vars.py          # rewrite
    python3 scripts/gen-example-vars.py --check  # exit 1 if a file is out of date
"""
import argparse
import glob
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "# ---- Reference: every setting of the roles on this group, with its default (scripts/gen-example-vars.py) ----"
# The roles of each group: the components map's (files/components.yml), in its order.
with open(os.path.join(ROOT, "files", "components.yml"), encoding="utf-8") as _handle:
    COMPONENTS = yaml.safe_load(_handle)["components"]
GROUPS = {group: [name for name, entry in COMPONENTS.items() if group in entry["groups"]]
          for group in ("gpu_nodes", "slurm_controllers", "management")}
# A default taken from the components map, shown with its value.
_FROM_MAP = re.compile(r"""\{\{ '(?P<name>\w+)' \| hpcobs_component_(?P<kind>port|listen) \}\}""")


def _with_value(line):
    match = _FROM_MAP.search(line)
    if not match:
        return line
    port = COMPONENTS[match.group("name")]["port"]
    return "%s  # %s (files/components.yml)" % (line, (":%d" % port) if match.group("kind") == "listen" else port)
# Roles documented in full in one group only; elsewhere a pointer is enough.
FULL_IN = {"node_exporter": "gpu_nodes", "promtail": "gpu_nodes", "alloy": "gpu_nodes", "slurm_hooks": "gpu_nodes"}


def defaults_text(role):
    base = os.path.join(ROOT, "roles", role, "defaults")
    files = [os.path.join(base, "main.yml")] if os.path.isfile(os.path.join(base, "main.yml")) else \
        sorted(glob.glob(os.path.join(base, "main", "*.yml")))
    lines = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for line in handle.read().splitlines():
                if line.strip() == "---":
                    continue
                if not line.strip():
                    lines.append("#")
                elif line.lstrip().startswith("#"):
                    lines.append(line)
                else:
                    lines.append("# " + _with_value(line))
    while lines and lines[0] == "#":
        lines.pop(0)
    return lines


def reference(group):
    out = [MARKER, "#"]
    for role in GROUPS[group]:
        out.append("# ==== %s (roles/%s/README.md) " % (role, role) + "=" * max(0, 100 - len(role) * 2))
        if FULL_IN.get(role, group) != group:
            out.append("# (every setting is listed in group_vars/%s.yml)" % FULL_IN[role])
        else:
            out.extend(defaults_text(role))
        out.append("#")
    return "\n".join(line.rstrip() for line in out) + "\n"


def updated(path, group):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    head = text.split(MARKER, 1)[0].rstrip("\n") + "\n\n"
    return head + reference(group)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for group in GROUPS:
        path = os.path.join(ROOT, "inventories", "example", "group_vars", group + ".yml")
        new = updated(path, group)
        with open(path, encoding="utf-8") as handle:
            if handle.read() == new:
                continue
        stale.append(path)
        if not args.check:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(new)
    if args.check and stale:
        sys.stderr.write("out of date (run scripts/gen-example-vars.py): %s\n" % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
