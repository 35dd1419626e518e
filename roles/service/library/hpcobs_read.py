#!/usr/bin/python
"""Ansible module: run a command that only reads (a query), cheaply, in check mode too."""

DOCUMENTATION = r"""
module: hpcobs_read
short_description: Run a read-only command (a query of the host) and return what it printed
description:
  - Runs I(argv) (no shell unless the argv asks for one) and returns its exit code and output, as
    C(ansible.builtin.command) does, for the queries the roles make of a host on every run: which packages are
    installed, the groups of a running service, the hooks' self-test.
  - Only for commands that change nothing: it never reports a change and runs in check mode too (a check run must
    know what the host has), so a task needs no C(changed_when) or C(check_mode) for it.
  - Imports nothing from Ansible (a JSONARGS module, as roles/service's hpcobs_files): a run on a host is one Python
    start with the standard library, not an AnsiballZ payload to unpack and compile, which is most of what
    C(ansible.builtin.command) costs the host (bench/module_cost.py). It checks its own arguments.
  - "A command that cannot be started fails the task with C(rc) 127; any exit code is otherwise returned, not judged:
    the task's C(failed_when) decides, as with C(ansible.builtin.command) (which fails on a non-zero one)."
options:
  argv:
    type: list
    elements: str
    required: true
    description: The command and its arguments.
  timeout:
    type: int
    default: 120
    description: Seconds before the command is killed and the task fails.
"""

RETURN = r"""
rc: {description: "The command's exit code (127: it could not be started)", type: int, returned: always}
stdout: {description: What it printed, without the last newline, type: str, returned: always}
stderr: {description: What it printed on stderr, without the last newline, type: str, returned: always}
stdout_lines: {description: stdout by line, type: list, returned: always}
stderr_lines: {description: stderr by line, type: list, returned: always}
cmd: {description: The argv run, type: list, returned: always}
"""

import json
import subprocess
import sys

# The controller puts the arguments here (a Python bytes literal of their JSON; the marker below, which makes this a
# JSONARGS module, receives the same JSON in a comment): <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>
ARGUMENTS = "<<INCLUDE_ANSIBLE_MODULE_COMPLEX_ARGS>>"


def arguments(raw):
    """(argv, timeout) from what Ansible sent (its `_ansible_*` keys left out); ValueError names what is wrong."""
    unknown = sorted(key for key in raw if key not in ("argv", "timeout") and not key.startswith("_ansible_"))
    if unknown:
        raise ValueError("Unsupported parameters for (hpcobs_read) module: %s. Supported parameters include: argv, "
                         "timeout." % ", ".join(unknown))
    argv = raw.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(item, str) for item in argv) or not argv[0]:
        raise ValueError("argv must be a non-empty list of strings (the command and its arguments), got %r" % (argv,))
    timeout = raw.get("timeout", 120)
    try:
        timeout = int(timeout)
    except (TypeError, ValueError):
        raise ValueError("timeout must be a number of seconds, got %r" % (timeout,)) from None
    if timeout <= 0:
        raise ValueError("timeout must be a number of seconds above 0, got %r" % (timeout,))
    return argv, timeout


def read(argv, timeout, run=subprocess.run):
    """The module's result for the command: rc, stdout, stderr (and their lines), cmd; never changed."""
    result = dict(changed=False, cmd=argv, rc=127, stdout="", stderr="")
    try:
        done = run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except OSError as error:
        result.update(failed=True, msg="%s could not be started: %s" % (argv[0], error.strerror or error))
    except subprocess.TimeoutExpired:
        result.update(failed=True, rc=-9, msg="%s did not end within %d s and was killed" % (argv[0], timeout))
    else:
        result.update(rc=done.returncode,
                      stdout=done.stdout.decode("utf-8", "replace").rstrip("\n"),
                      stderr=done.stderr.decode("utf-8", "replace").rstrip("\n"))
    result.update(stdout_lines=result["stdout"].splitlines(), stderr_lines=result["stderr"].splitlines())
    return result


def run(raw):
    try:
        argv, timeout = arguments(raw)
    except ValueError as error:
        return dict(changed=False, failed=True, msg=str(error))
    return read(argv, timeout)


def main():
    result = run(json.loads(ARGUMENTS))
    sys.stdout.write(json.dumps(result))
    sys.exit(1 if result.get("failed") else 0)


if __name__ == "__main__":
    main()
