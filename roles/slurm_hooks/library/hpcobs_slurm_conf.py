#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module of the slurm_hooks role: put the hpcobs Prolog/Epilog and PrologFlags into slurm.conf."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hpcobs_slurm_conf
short_description: Add the hpcobs Prolog/Epilog globs and PrologFlags to slurm.conf without clobbering a site's hooks
description:
  - Reads slurm.conf (and the files it includes, read-only) the way Slurm does (case-insensitive keys, several
    C(key=value) pairs per line, double-quoted values, C(#) comments) and makes three settings hold.
  - C(Prolog=<prolog>) and C(Epilog=<epilog>) are added when the file has no Prolog (Epilog) at all, and left alone
    when the file already has exactly that value. Any other Prolog (Epilog) is a conflict; so is one set in an
    included file that differs.
  - Every flag of I(prolog_flags) is merged into an existing C(PrologFlags=) value (C(Contain) becomes
    C(Alloc,Contain)); without a PrologFlags line one is added. A PrologFlags in an included file that lacks a flag
    is a conflict (the module never edits included files).
  - New lines go in one commented block before the first node or partition definition (at the end when there is
    none). The file is replaced atomically, keeping its owner and mode. Nothing is written when there is a conflict.
options:
  path:
    description: slurm.conf to edit.
    type: path
    required: true
  prolog:
    description: Value wanted for Prolog (e.g. C(/etc/slurm/prolog.d/*)).
    type: str
    required: true
  epilog:
    description: Value wanted for Epilog (e.g. C(/etc/slurm/epilog.d/*)).
    type: str
    required: true
  prolog_flags:
    description: Flags that PrologFlags must contain.
    type: list
    elements: str
    default: [Alloc]
  fail_on_conflict:
    description: Fail when a conflict is found (otherwise report it in C(conflicts) and change nothing).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

RETURN = r"""
conflicts:
  description: Settings that stop the edit; each has key, value, wanted, file and line.
  type: list
  returned: always
added:
  description: Lines added.
  type: list
  returned: always
merged:
  description: PrologFlags values rewritten, as "old -> new".
  type: list
  returned: always
current:
  description: Values found for Prolog, Epilog and PrologFlags (lists, in file order, included files too).
  type: dict
  returned: always
warnings:
  description: Include lines that could not be followed.
  type: list
  returned: always
"""

import glob
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

BLOCK_COMMENT = "# hpcobs slurm_hooks role: job attribution prolog/epilog (see that role's README before changing)"
# Lines that start the node/partition part of slurm.conf; new global settings go before the first of them.
SECTION_KEYS = ("nodename", "nodeset", "partitionname", "downnodes", "frontendname", "switchname")
PAIR = re.compile(r'([^\s=]+)=("([^"]*)"|\S*)')
INCLUDE = re.compile(r"^\s*include\s+(\S.*?)\s*$", re.IGNORECASE)


def strip_comment(line):
    """The part of a slurm.conf line before its comment (a '#' not escaped by a backslash)."""
    match = re.search(r"(?<!\\)#", line)
    return line if match is None else line[:match.start()]


def scan(text):
    """Yield (line index, key in lower case, value, value start, value end) for every setting of a file's text.

    An Include line yields the key "include" with the included path and no position.
    """
    for index, line in enumerate(text.splitlines()):
        body = strip_comment(line)
        include = INCLUDE.match(body)
        if include:
            yield index, "include", include.group(1), None, None
            continue
        for match in PAIR.finditer(body):
            if match.group(3) is not None:
                start, end, value = match.start(3), match.end(3), match.group(3)
            else:
                start, end, value = match.start(2), match.end(2), match.group(2)
            yield index, match.group(1).lower(), value, start, end


def split_flags(value):
    return [flag.strip() for flag in value.split(",") if flag.strip()]


def resolve_includes(pattern, base_dir):
    """Paths of an Include line (relative to slurm.conf's directory, globs allowed); None when not resolvable."""
    if "%" in pattern:
        return None
    path = pattern if pattern.startswith("/") else os.path.join(base_dir, pattern)
    if any(char in path for char in "*?["):
        return sorted(glob.glob(path))
    return [path]


def plan(text, prolog, epilog, prolog_flags, path="slurm.conf", read_file=None):
    """Work out the edit. Returns a dict: new_text, conflicts, added, merged, current, warnings.

    read_file(path) -> text or None is used to follow Include lines (default: read from disk).
    """
    if read_file is None:
        read_file = _read_or_none
    wanted = {"prolog": prolog, "epilog": epilog}
    names = {"prolog": "Prolog", "epilog": "Epilog", "prologflags": "PrologFlags"}
    result = {"conflicts": [], "added": [], "merged": [], "warnings": [],
              "current": {"Prolog": [], "Epilog": [], "PrologFlags": []}}
    lines = text.splitlines()
    seen = {"prolog": False, "epilog": False, "prologflags": False}
    edits = {}  # line index -> list of (start, end, new value)
    state = {"first_section": None}

    def visit(file_text, file_path, level, main):
        for index, key, value, start, end in scan(file_text):
            if key == "include":
                if level >= 8:
                    result["warnings"].append("%s line %d: includes nested too deep, not followed" % (file_path, index + 1))
                    continue
                paths = resolve_includes(value, os.path.dirname(file_path) or ".")
                if paths is None:
                    result["warnings"].append("%s line %d: Include %s not followed (modifiers)" % (file_path, index + 1, value))
                    continue
                for included in paths:
                    included_text = read_file(included)
                    if included_text is None:
                        result["warnings"].append("%s line %d: Include %s cannot be read" % (file_path, index + 1, included))
                        continue
                    visit(included_text, included, level + 1, False)
                continue
            if main and key in SECTION_KEYS and state["first_section"] is None:
                state["first_section"] = index
            if key not in names:
                continue
            seen[key] = True
            result["current"][names[key]].append(value)
            where = {"file": file_path, "line": index + 1}
            if key in wanted:
                if value != wanted[key]:
                    result["conflicts"].append(dict(where, key=names[key], value=value, wanted=wanted[key]))
                continue
            flags = split_flags(value)
            missing = [flag for flag in prolog_flags if flag.lower() not in [f.lower() for f in flags]]
            if not missing:
                continue
            if not main:
                result["conflicts"].append(dict(where, key="PrologFlags", value=value,
                                                wanted=",".join(missing + flags)))
                continue
            new_value = ",".join(missing + flags)
            edits.setdefault(index, []).append((start, end, new_value))
            result["merged"].append("PrologFlags=%s -> PrologFlags=%s" % (value, new_value))

    visit(text, path, 0, True)
    first_section = state["first_section"]

    for index, changes in edits.items():
        line = lines[index]
        for start, end, value in sorted(changes, reverse=True):
            line = line[:start] + value + line[end:]
        lines[index] = line

    new_lines = []
    if not seen["prolog"]:
        new_lines.append("Prolog=%s" % prolog)
    if not seen["epilog"]:
        new_lines.append("Epilog=%s" % epilog)
    if not seen["prologflags"] and prolog_flags:
        new_lines.append("PrologFlags=%s" % ",".join(prolog_flags))
    result["added"] = list(new_lines)
    if new_lines:
        block = [BLOCK_COMMENT] + new_lines
        if first_section is None:
            if lines and lines[-1].strip():
                block = [""] + block
            lines = lines + block
        else:
            lines = lines[:first_section] + block + [""] + lines[first_section:]
    new_text = "\n".join(lines) + "\n" if lines else ""
    if not edits and not new_lines:
        new_text = text
    result["new_text"] = new_text
    return result


def _read_or_none(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def describe(conflict):
    return "%s=%s (%s line %d; hpcobs needs %s)" % (conflict["key"], conflict["value"], conflict["file"],
                                                     conflict["line"], conflict["wanted"])


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "prolog": {"type": "str", "required": True},
            "epilog": {"type": "str", "required": True},
            "prolog_flags": {"type": "list", "elements": "str", "default": ["Alloc"]},
            "fail_on_conflict": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    for name in ("prolog", "epilog"):
        value = module.params[name]
        if not value.startswith("/") or re.search(r'[\s"#=]', value):
            module.fail_json(msg="%s must be an absolute path without blanks, quotes, '#' or '=' (got %r)" % (name, value))
    flags = module.params["prolog_flags"]
    if any(not re.match(r"^[A-Za-z]+$", flag) for flag in flags):
        module.fail_json(msg="prolog_flags must be flag names such as Alloc (got %r)" % (flags,))
    if not os.path.isfile(path):
        module.fail_json(msg="%s does not exist or is not a file" % path, conflicts=[], added=[], merged=[],
                         current={}, warnings=[])
    text = _read_or_none(path)
    if text is None:
        module.fail_json(msg="cannot read %s" % path)
    result = plan(text, module.params["prolog"], module.params["epilog"], flags, path=path)
    new_text = result.pop("new_text")
    output = dict(result, changed=False)
    if result["conflicts"]:
        output["msg"] = "; ".join(describe(conflict) for conflict in result["conflicts"])
        if module.params["fail_on_conflict"]:
            module.fail_json(**output)
        module.exit_json(**output)
    if new_text != text:
        output["changed"] = True
        if module._diff:
            output["diff"] = {"before": text, "after": new_text, "before_header": path, "after_header": path}
        if not module.check_mode:
            directory = os.path.dirname(path) or "."
            fd, tmp = tempfile.mkstemp(prefix=".hpcobs-slurm.conf.", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(new_text)
                module.atomic_move(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    module.exit_json(**output)


if __name__ == "__main__":
    main()
