"""Action plugin of hpcobs_files: reads each file's source on the controller, then one module run on the host.

Each entry of `files` has `dest` and either `src` (a file on the controller, e.g. in the site PKI) or `content`
(text made by the task), plus `owner`, `group`, `mode`. In check mode a `src` that does not exist yet (the PKI role
only reported what it would make) is left out and named in `skipped`; in a real run it is an error, raised before
the host is touched. Contents travel to the module base64-encoded in its arguments (stdin with pipelining, never
argv) and the module's option is no_log: they are never in the result, the log or a diff.

`account` ({user, group, home, shell, comment}) is made first (a system group, a system user in it), in the same
module run.

`units` (unit names): their state is read after the files are written (one systemctl show); the result's
`units_active_enabled` names those active and enabled.

`remove_units` (unit names): units that should not be there, stopped, disabled and their files removed first.

`relabel` (absolute paths): restorecon -R -v over them after the files are written (-n in check mode); the task
passes them only on a host with SELinux enabled.

`binaries` ({dest, src, sha256, owner, group, mode}) are large files (programs): the first module run compares each
with its sha256 on the host and names those that differ; only those are sent (into Ansible's temporary directory on
the host), and a second run installs them, checking the sha256 of what arrived. A converged host costs one module
run for all of them, not a stat and a file run per program.

The module imports nothing from Ansible (a JSONARGS module: one Python start on the host, not an AnsiballZ payload
to unpack and compile), so its arguments are validated here, on the controller, against MODULE_ARGUMENT_SPEC, with
their defaults filled in, before the host is touched.
"""
from __future__ import annotations

import base64
import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase

FILE_KEYS = {"dest", "src", "content", "owner", "group", "mode", "validate", "diff"}
DIRECTORY_KEYS = {"path", "owner", "group", "mode"}
BINARY_KEYS = {"dest", "src", "sha256", "owner", "group", "mode"}
ACCOUNT_KEYS = {"user", "group", "home", "shell", "comment"}

# What the module takes (its DOCUMENTATION describes each option); paths are absolute (checked below), not expanded.
MODULE_ARGUMENT_SPEC = dict(
    account=dict(type="dict", options=dict(
        user=dict(type="str", required=True),
        group=dict(type="str", required=True),
        home=dict(type="str", default="/nonexistent"),
        shell=dict(type="str", default="/usr/sbin/nologin"),
        comment=dict(type="str", default=""),
    )),
    directories=dict(type="list", elements="dict", default=[], options=dict(
        path=dict(type="str", required=True),
        owner=dict(type="str", default="root"),
        group=dict(type="str", default="root"),
        mode=dict(type="raw", default="0755"),
    )),
    files=dict(type="list", elements="dict", default=[], options=dict(
        dest=dict(type="str", required=True),
        content=dict(type="str", required=True, no_log=True),
        owner=dict(type="str", default="root"),
        group=dict(type="str", default="root"),
        mode=dict(type="raw", default="0644"),
        validate=dict(type="str"),
        diff=dict(type="bool", default=False),
    )),
    absent=dict(type="list", elements="str", default=[]),
    binaries=dict(type="list", elements="dict", default=[], options=dict(
        dest=dict(type="str", required=True),
        sha256=dict(type="str", required=True),
        src=dict(type="str"),
        owner=dict(type="str", default="root"),
        group=dict(type="str", default="root"),
        mode=dict(type="raw", default="0755"),
    )),
    units=dict(type="list", elements="str", default=[]),
    relabel=dict(type="list", elements="str", default=[]),
    remove_units=dict(type="list", elements="str", default=[]),
)
_VALIDATOR = ArgumentSpecValidator(MODULE_ARGUMENT_SPEC)


def module_arguments(arguments):
    """The module's arguments validated against MODULE_ARGUMENT_SPEC, defaults filled in; every path of a directory,
    file or binary absolute (`absent` is checked where the task's arguments are read). Raises AnsibleActionFail naming
    what is wrong."""
    result = _VALIDATOR.validate(arguments)
    if result.error_messages:
        raise AnsibleActionFail("hpcobs_files: %s" % "; ".join(result.error_messages))
    params = result.validated_parameters
    paths = ([("directories", entry["path"]) for entry in params["directories"]]
             + [("files", entry["dest"]) for entry in params["files"]]
             + [("binaries", entry["dest"]) for entry in params["binaries"]]
             + [("relabel", path) for path in params["relabel"]])
    for what, path in paths:
        if not path.startswith("/"):
            raise AnsibleActionFail("hpcobs_files: %s: %r is not an absolute path" % (what, path))
    return params


def check_entries(entries, allowed, required, what):
    """A list of dicts whose keys are known and whose required key is set: else a message naming the entry."""
    if not isinstance(entries, list):
        raise AnsibleActionFail("hpcobs_files: %s must be a list, got %s" % (what, type(entries).__name__))
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise AnsibleActionFail("hpcobs_files: %s[%d] must be a mapping" % (what, index))
        unknown = sorted(set(entry) - allowed)
        if unknown:
            raise AnsibleActionFail("hpcobs_files: %s[%d] has unknown keys %s (allowed: %s)"
                                    % (what, index, ", ".join(unknown), ", ".join(sorted(allowed))))
        if not entry.get(required):
            raise AnsibleActionFail("hpcobs_files: %s[%d] has no %s" % (what, index, required))


def encode_files(files, check_mode, read):
    """(module entries, skipped dests): each entry's content base64; `read(src)` returns a source's bytes or None
    when it does not exist."""
    encoded, skipped = [], []
    for entry in files:
        has_src, has_content = "src" in entry, "content" in entry
        if has_src == has_content:
            raise AnsibleActionFail("hpcobs_files: %s needs exactly one of src and content" % entry["dest"])
        if has_src:
            data = read(entry["src"])
            if data is None:
                if check_mode:
                    skipped.append(entry["dest"])
                    continue
                raise AnsibleActionFail("hpcobs_files: %s: its source %s does not exist on the controller (nothing "
                                        "was changed on the host)" % (entry["dest"], entry["src"]))
        else:
            data = to_bytes(entry["content"], errors="surrogate_or_strict")
        item = {key: entry[key] for key in ("dest", "owner", "group", "mode", "validate", "diff") if key in entry}
        item["content"] = to_text(base64.b64encode(data))
        encoded.append(item)
    return encoded, skipped


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("account", "directories", "files", "absent", "binaries", "units", "relabel",
                             "remove_units"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        account = self._task.args.get("account")
        if account is not None:
            check_entries([account], ACCOUNT_KEYS, "user", "account")
            if not account.get("group"):
                raise AnsibleActionFail("hpcobs_files: account has no group")
        directories = self._task.args.get("directories", [])
        files = self._task.args.get("files", [])
        absent = self._task.args.get("absent", [])
        if not isinstance(absent, list) or not all(isinstance(path, str) and path.startswith("/") for path in absent):
            raise AnsibleActionFail("hpcobs_files: absent must be a list of absolute paths, got %r" % (absent,))
        check_entries(directories, DIRECTORY_KEYS, "path", "directories")
        check_entries(files, FILE_KEYS, "dest", "files")
        binaries = self._task.args.get("binaries", [])
        check_entries(binaries, BINARY_KEYS, "dest", "binaries")
        for binary in binaries:
            if not binary.get("src") or not binary.get("sha256"):
                raise AnsibleActionFail("hpcobs_files: binary %s needs src and sha256" % binary["dest"])
            if not os.path.isfile(binary["src"]):
                raise AnsibleActionFail("hpcobs_files: %s: its source %s is not a file on the controller (nothing "
                                        "was changed on the host)" % (binary["dest"], binary["src"]))

        def read(src):
            path = src if os.path.isabs(src) else self._find_needle("files", src)
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                return None

        encoded, skipped = encode_files(files, self._task.check_mode, read)
        compare = [{key: value for key, value in binary.items() if key != "src"} for binary in binaries]
        units = self._task.args.get("units", [])
        if not isinstance(units, list) or not all(isinstance(name, str) for name in units):
            raise AnsibleActionFail("hpcobs_files: units must be a list of unit names, got %r" % (units,))
        relabel = self._task.args.get("relabel", [])
        module_args = {"directories": directories, "files": encoded, "absent": absent, "binaries": compare,
                       "units": units, "relabel": relabel, "remove_units": self._task.args.get("remove_units", [])}
        if account is not None:
            module_args["account"] = account
        module = self._execute_module(module_name="hpcobs_files", module_args=module_arguments(module_args),
                                      task_vars=task_vars)
        if not module.get("failed") and module.get("transfer"):
            module = self._send(binaries, module, task_vars, units, relabel)
        result.update(module)
        if skipped:
            result["skipped_paths"] = skipped
        return result

    def _send(self, binaries, first, task_vars, units, relabel):
        """Send the binaries the first run named into the host's temporary directory, install them in a second run,
        remove the temporary directory; the result of both runs."""
        wanted = set(first["transfer"])
        shell = self._connection._shell
        if not shell.tmpdir:
            self._make_tmp_path()
        try:
            sent = []
            for index, binary in enumerate(binaries):
                if binary["dest"] in wanted:
                    remote = shell.join_path(shell.tmpdir, "binary-%d" % index)
                    self._transfer_file(binary["src"], remote)
                    sent.append(dict(binary, src=remote))
            self._fixup_perms2([shell.tmpdir] + [binary["src"] for binary in sent])
            second = self._execute_module(module_name="hpcobs_files",
                                          module_args=module_arguments({"binaries": sent, "units": units,
                                                                             "relabel": relabel}),
                                          task_vars=task_vars)
        finally:
            self._remove_tmp_path(shell.tmpdir)
        paths = first.get("changed_paths", []) + second.get("changed_paths", [])
        merged = dict(first, **second)
        merged.update(changed=bool(paths), changed_paths=list(dict.fromkeys(paths)), transfer=first["transfer"])
        return merged
