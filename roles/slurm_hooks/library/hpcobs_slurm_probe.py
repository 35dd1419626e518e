#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module of the slurm_hooks role: what its preflight needs to know about a host, read in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hpcobs_slurm_probe
short_description: Read the Slurm version and the paths the hooks need, in one module run (read only)
description:
  - Finds the first of I(commands) on I(path) and reads its version (C(-V)); with I(need_rename), first checks that
    util-linux's rename (C(rename.ul), or a C(rename) from util-linux) is there, as the hooks run it to publish their
    staged files (Perl's rename takes other arguments).
  - With I(tmpfiles_dir), reads C(systemd-tmpfiles --cat-config) and says whether an entry (d, D, v, q, Q) declares
    that directory, so that one under /run comes back after a reboot.
  - With I(textfile_dir) and I(slurm_conf), says whether they are a directory and a regular file (a symlink is
    neither).
  - Replaces a shell task, a command task and two stat tasks of the role's preflight: one round trip per host.
    Changes nothing, in check mode too.
  - Imports nothing from Ansible: the controller hands it its arguments as JSON inside the module's own text (a
    JSONARGS module, as roles/service's hpcobs_files), so a run on the host is one Python start with the standard
    library, not an AnsiballZ payload to unpack and compile (bench/module_cost.py). It checks its arguments itself
    (arguments() below) and refuses unknown ones, as AnsibleModule would.
options:
  commands:
    description: Slurm commands to try, in order (the first found gives the version).
    type: list
    elements: str
    required: true
  path:
    description: PATH to look for them (and for rename) on.
    type: str
    required: true
  need_rename:
    description: Require util-linux's rename (GPU nodes, where the hooks run).
    type: bool
    default: false
  tmpfiles_dir:
    description: A directory whose tmpfiles.d declaration to look for; empty for none.
    type: str
    default: ""
  textfile_dir:
    description: A path that must be a directory; empty for none.
    type: str
    default: ""
  slurm_conf:
    description: A path that must be a regular file; empty for none.
    type: str
    default: ""
"""

RETURN = r"""
version_rc: {description: "0 a version was read; 1 none of the commands was found; 2 util-linux rename is missing", type: int, returned: always}
version: {description: "The command and what its -V printed, e.g. C(slurmd slurm 24.11.5)", type: str, returned: always}
version_error: {description: Why there is no version, type: str, returned: always}
tmpfiles_declared: {description: "Whether a tmpfiles.d entry declares I(tmpfiles_dir); null when not asked", type: bool, returned: always}
textfile_isdir: {description: "Whether I(textfile_dir) is a directory; null when not asked", type: bool, returned: always}
slurm_conf_isreg: {description: "Whether I(slurm_conf) is a regular file; null when not asked", type: bool, returned: always}
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys

# The controller puts the arguments here (a Python bytes literal of their JSON; the marker below, which makes this a
# JSONARGS module, receives the same JSON in a comment): <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>
ARGUMENTS = "<<INCLUDE_ANSIBLE_MODULE_COMPLEX_ARGS>>"

# name: (type, required, default), as DOCUMENTATION says
OPTIONS = {
    "commands": (list, True, None),
    "path": (str, True, None),
    "need_rename": (bool, False, False),
    "tmpfiles_dir": (str, False, ""),
    "textfile_dir": (str, False, ""),
    "slurm_conf": (str, False, ""),
}
# Ansible's spellings of a boolean (module_utils.parsing.convert_bool)
TRUE = ("y", "yes", "on", "1", "true", "t", "1.0")
FALSE = ("n", "no", "off", "0", "false", "f", "0.0")

NO_RENAME = "util-linux rename (rename.ul or rename from util-linux), which the hooks run, is not installed"


def _run(argv, env):
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env,
                          check=False)


def has_util_linux_rename(path, run=_run):
    """rename.ul answers --version, or the rename found says it is util-linux's."""
    env = dict(os.environ, PATH=path, LC_ALL="C")
    for name in ("rename.ul", "rename"):
        found = shutil.which(name, path=path)
        if not found:
            continue
        try:
            result = run([found, "--version"], env)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if name == "rename.ul" and result.returncode == 0:
            return True
        if name == "rename" and "util-linux" in (result.stdout or "") + (result.stderr or ""):
            return True
    return False


def slurm_version(commands, path, need_rename, run=_run):
    """(rc, version, error): see RETURN."""
    if need_rename and not has_util_linux_rename(path, run):
        return 2, "", NO_RENAME
    env = dict(os.environ, PATH=path, LC_ALL="C")
    for name in commands:
        found = shutil.which(name, path=path)
        if not found:
            continue
        try:
            result = run([found, "-V"], env)
        except (OSError, subprocess.TimeoutExpired) as error:
            return 1, "", "%s -V failed: %s" % (found, error)
        return 0, ("%s %s" % (name, ((result.stdout or "") + (result.stderr or "")).strip())).strip(), ""
    return 1, "", "none of %s found in %s" % (" ".join(commands), path)


def tmpfiles_declares(config, directory):
    """Whether the text of `systemd-tmpfiles --cat-config` has an entry making the directory (d, D, v, q, Q)."""
    pattern = r"(?m)^[dDvqQ]\s+" + re.escape(directory.rstrip("/")) + r"/?(\s|$)"
    return re.search(pattern, config) is not None


def is_kind(path, test):
    """The path itself, not what a symlink there points at (a symlinked slurm.conf is not the role's to replace)."""
    try:
        return test(os.lstat(path).st_mode)
    except OSError:
        return False


class ArgumentError(Exception):
    """Arguments the module does not take: the message names them."""


def arguments(raw):
    """The module's parameters from what Ansible sent (its own `_ansible_*` keys left out): known options only,
    required ones present, each of its type (a boolean also as Ansible spells one, a list of strings for commands),
    defaults filled in."""
    unknown = sorted(key for key in raw if key not in OPTIONS and not key.startswith("_ansible_"))
    if unknown:
        raise ArgumentError("Unsupported parameters for (hpcobs_slurm_probe) module: %s. Supported parameters "
                            "include: %s." % (", ".join(unknown), ", ".join(sorted(OPTIONS))))
    params = {}
    for name, (kind, required, default) in OPTIONS.items():
        value = raw.get(name)
        if value is None:
            if required:
                raise ArgumentError("missing required arguments: %s" % name)
            value = default
        elif kind is bool and not isinstance(value, bool):
            text = str(value).strip().lower()
            if text not in TRUE + FALSE:
                raise ArgumentError("argument '%s' is of type %s and we were unable to convert to bool: %r"
                                    % (name, type(value).__name__, value))
            value = text in TRUE
        elif kind is list:
            if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
                raise ArgumentError("argument '%s' must be a non-empty list of strings, got %r" % (name, value))
        elif not isinstance(value, kind):
            raise ArgumentError("argument '%s' must be a string, got %r" % (name, value))
        params[name] = value
    return params


def probe(params):
    """The module's result for its checked parameters."""
    rc, version, error = slurm_version(params["commands"], params["path"], params["need_rename"])
    result = dict(changed=False, version_rc=rc, version=version, version_error=error, tmpfiles_declared=None,
                  textfile_isdir=None, slurm_conf_isreg=None)
    if params["tmpfiles_dir"]:
        argv = ["systemd-tmpfiles", "--cat-config"]
        try:
            config = _run(argv, dict(os.environ, LC_ALL="C", SYSTEMD_PAGER=""))
        except (OSError, subprocess.TimeoutExpired) as failure:
            return dict(result, failed=True, msg="systemd-tmpfiles --cat-config could not run: %s" % failure)
        if config.returncode != 0:
            return dict(result, failed=True, msg="systemd-tmpfiles --cat-config exited %d: %s"
                        % (config.returncode, config.stderr.strip()[:600]))
        result["tmpfiles_declared"] = tmpfiles_declares(config.stdout, params["tmpfiles_dir"])
    if params["textfile_dir"]:
        result["textfile_isdir"] = is_kind(params["textfile_dir"], stat.S_ISDIR)
    if params["slurm_conf"]:
        result["slurm_conf_isreg"] = is_kind(params["slurm_conf"], stat.S_ISREG)
    return result


def run(raw):
    """The answer to what Ansible sent (read only: the same in check mode)."""
    try:
        return probe(arguments(raw))
    except ArgumentError as error:
        return dict(changed=False, failed=True, msg=str(error))


def main():
    result = run(json.loads(ARGUMENTS))
    sys.stdout.write(json.dumps(result))
    sys.exit(1 if result.get("failed") else 0)


if __name__ == "__main__":
    main()
