"""Action plugin of hpcobs_files: reads each file's source on the controller, then one module run on the host.

Each entry of `files` has `dest` and either `src` (a file on the controller, e.g. in the site PKI) or `content`
(text made by the task), plus `owner`, `group`, `mode`. In check mode a `src` that does not exist yet (the PKI role
only reported what it would make) is left out and named in `skipped`; in a real run it is an error, raised before
the host is touched. Contents travel to the module base64-encoded in its arguments (stdin with pipelining, never
argv) and the module's option is no_log: they are never in the result, the log or a diff.
"""
from __future__ import annotations

import base64
import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase

FILE_KEYS = {"dest", "src", "content", "owner", "group", "mode", "validate", "diff"}
DIRECTORY_KEYS = {"path", "owner", "group", "mode"}


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
    _VALID_ARGS = frozenset(("directories", "files", "absent"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        directories = self._task.args.get("directories", [])
        files = self._task.args.get("files", [])
        absent = self._task.args.get("absent", [])
        if not isinstance(absent, list) or not all(isinstance(path, str) and path.startswith("/") for path in absent):
            raise AnsibleActionFail("hpcobs_files: absent must be a list of absolute paths, got %r" % (absent,))
        check_entries(directories, DIRECTORY_KEYS, "path", "directories")
        check_entries(files, FILE_KEYS, "dest", "files")

        def read(src):
            path = src if os.path.isabs(src) else self._find_needle("files", src)
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                return None

        encoded, skipped = encode_files(files, self._task.check_mode, read)
        module = self._execute_module(module_name="hpcobs_files",
                                      module_args={"directories": directories, "files": encoded, "absent": absent},
                                      task_vars=task_vars)
        module.pop("invocation", None)
        result.update(module)
        if skipped:
            result["skipped_paths"] = skipped
        return result
