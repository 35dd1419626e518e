#!/usr/bin/python
"""Ansible module: a service's directories and small files (TLS set, credentials, configuration) in one run."""

DOCUMENTATION = r"""
module: hpcobs_files
short_description: Make a set of directories and small files match, in one module run
description:
  - Creates each directory of I(directories) and fixes its owner, group and mode; then, for each file of I(files),
    compares the content with the file on the host (sha256) and replaces it atomically (a temporary file in the same
    directory, owner, group and mode set before the rename, fsync) when it differs, or fixes only its owner, group
    and mode when just those differ.
  - One module run for what would otherwise be a stat and a copy per file: on a converged host the whole set costs
    one round trip.
  - Contents are never returned, logged or shown as a diff (the option is no_log, and the module logs nothing); the
    result names the paths that changed (or would change in check mode).
  - Called through the action plugin of the same name (roles/service/action_plugins), which reads C(src) files on
    the controller, validates the arguments and fills in their defaults; see roles/service/README.md (entry points
    tls, web_config, web_tls).
  - Imports nothing from Ansible: the controller hands it its arguments as JSON inside the module's own text (a
    JSONARGS module), so a run on the host costs one Python start with the standard library, not the unpacking and
    compiling of Ansible's module_utils that every AnsiballZ module pays (about 0.3 s of CPU a run, measured in
    bench/module_cost.py).
options:
  account:
    type: dict
    description:
      - "C({user, group, home, shell, comment}): a system group and a system user whose primary group it is, made
        before the directories (which may belong to them): C(groupadd --system), C(useradd --system --no-create-home);
        an existing user whose primary group, home, shell or comment differ is changed with C(usermod). Replaces an
        C(ansible.builtin.group) and an C(ansible.builtin.user) task: one module run on a converged host."
      - "In check mode nothing is made; the result says which would be (C(group_changed), C(user_changed))."
  directories:
    type: list
    elements: dict
    default: []
    description: "C({path, owner, group, mode}): made when missing (missing parents too, 0755), never emptied."
  files:
    type: list
    elements: dict
    default: []
    description:
      - "C({dest, content (base64), owner, group, mode, validate, diff})."
      - "C(validate): a command run on the new content before it replaces the file, C(%s) standing for the
        temporary file (as the copy and template modules' option): a non-zero exit fails the task and leaves the old
        file in place. Not run in check mode, nor for a file whose content is already right."
      - "C(diff): true for a file whose content may be shown (a unit, a configuration without secrets): with
        C(--diff), the result holds the old and the new text of each changed one. Never set for a secret."
  absent:
    type: list
    elements: path
    default: []
    description: "Files removed when they exist (after the files above): a symlink is removed, not followed; a
      directory is refused."
  binaries:
    type: list
    elements: dict
    default: []
    description:
      - "C({dest, sha256, owner, group, mode, src}): large files (programs) compared by their sha256 on the host, so
        their content does not travel in the arguments. One without C(src) that differs is only named in
        C(transfer) (the action plugin then sends it); with C(src), a file the action plugin sent into its
        temporary directory, it is installed atomically like a file of I(files) once its sha256 is the one
        expected."
  units:
    type: list
    elements: str
    default: []
    description:
      - "systemd units (C(name.service), C(name.socket)) whose state is read after the files are written, with one
        C(systemctl show): those active and enabled are named in C(units_active_enabled). Lets the role skip its
        enable-and-start task (a module run of its own) for a unit this run left as it was and that already runs.
        Read only, check mode too; a unit that cannot be read is simply not named."
  remove_units:
    type: list
    elements: str
    default: []
    description:
      - "systemd units (C(name.service)) that should not be there: each whose file is in /etc/systemd/system is stopped
        and disabled (C(systemctl disable --now)), its file removed, then systemd reloaded once; before anything
        else of the run. A unit that is not there costs nothing. In check mode only named."
  relabel:
    type: list
    elements: path
    default: []
    description:
      - "Paths given their SELinux policy's default labels after the files are written (C(restorecon -R -v); in check
        mode C(-n), which only reports). Those relabelled (or that would be) count as changed paths, so a service
        started under a wrong label is restarted by the task's handler. The task passes it only on a host with
        SELinux enabled; a restorecon that fails fails the task."
"""

RETURN = r"""
group_changed: {description: The account's group was (or would be) made, type: bool, returned: always}
user_changed: {description: "The account's user was (or would be) made or changed", type: bool, returned: always}
changed_paths: {description: Paths made or changed (or that would be in check mode), type: list, returned: always}
diff: {description: "With --diff, before and after of each changed file marked C(diff)", type: list, returned: with --diff}
units_active_enabled: {description: "Units of C(units) that are active and enabled", type: list, returned: always}
relabelled: {description: "Paths restorecon relabelled (or would in check mode)", type: list, returned: always}
transfer: {description: "Binaries whose content differs and that came without C(src): the action plugin sends them", type: list, returned: always}
"""

import base64
import grp
import hashlib
import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile

# The controller puts the arguments here (a Python bytes literal of their JSON; the marker below, which makes this a
# JSONARGS module, receives the same JSON in a comment): <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>
ARGUMENTS = "<<INCLUDE_ANSIBLE_MODULE_COMPLEX_ARGS>>"


class FilesError(Exception):
    """A wrong request: the message names the path and what is wrong."""


def parse_mode(value, path):
    """An octal mode given as text ("0640", "640") or a number; anything else is refused."""
    text = str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value & 0o7777
    if not text or any(char not in "01234567" for char in text) or len(text) > 4:
        raise FilesError("%s: mode %r is not an octal mode such as 0640" % (path, value))
    return int(text, 8)


def owner_ids(owner, group, path, check_mode):
    """(uid, gid) of the names; None for an account that does not exist yet in check mode (it would be made by an
    earlier task of the same run), an error otherwise."""
    ids = []
    for kind, name, lookup in (("user", owner, lambda n: pwd.getpwnam(n).pw_uid),
                               ("group", group, lambda n: grp.getgrnam(n).gr_gid)):
        try:
            ids.append(lookup(name))
        except KeyError:
            if check_mode:
                ids.append(None)
            else:
                raise FilesError("%s: the %s %r does not exist on this host" % (path, kind, name))
    return ids[0], ids[1]


def attributes_differ(info, uid, gid, mode):
    return (uid is None or gid is None or info.st_uid != uid or info.st_gid != gid
            or stat.S_IMODE(info.st_mode) != mode)


def sync_directory(entry, check_mode):
    """Make one directory; True when it was (or would be) made or changed."""
    path = entry["path"]
    mode = parse_mode(entry.get("mode", "0755"), path)
    uid, gid = owner_ids(entry.get("owner", "root"), entry.get("group", "root"), path, check_mode)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise FilesError("%s exists and is not a directory: nothing was changed; move it away first" % path)
    if info is not None and not attributes_differ(info, uid, gid, mode):
        return False
    if not check_mode:
        if info is None:
            # Missing parents as `file: state=directory` makes them (root's 0755); the directory itself is made
            # private and then given its owner and mode.
            os.makedirs(os.path.dirname(path.rstrip("/")) or "/", 0o755, exist_ok=True)
            os.mkdir(path, 0o700)
        os.chown(path, uid, gid, follow_symlinks=False)
        os.chmod(path, mode)
    return True


ACCOUNT_NAME = "abcdefghijklmnopqrstuvwxyz0123456789_-"


def account_commands(account, lookup_user, lookup_group):
    """The commands that make the account as asked ([] when it already is): groupadd for a missing group, then
    useradd for a missing user or usermod with only the fields that differ. lookup_user(name) and lookup_group(name)
    return the pwd/grp entry or raise KeyError."""
    user, group = account.get("user") or "", account.get("group") or ""
    for kind, name in (("user", user), ("group", group)):
        if not name or name[0] == "-" or any(char not in ACCOUNT_NAME for char in name) or len(name) > 32:
            raise FilesError("account: the %s name %r is not a lowercase system account name" % (kind, name))
    home, shell = account.get("home") or "/nonexistent", account.get("shell") or "/usr/sbin/nologin"
    comment = account.get("comment") or ""
    for what, value in (("home", home), ("shell", shell)):
        if not value.startswith("/"):
            raise FilesError("account %s: the %s %r is not an absolute path" % (user, what, value))
    if any(char in comment for char in ":\n"):
        raise FilesError("account %s: the comment may not hold ':' or a line break" % user)
    commands = []
    try:
        gid = lookup_group(group).gr_gid
    except KeyError:
        gid = None
        commands.append(["groupadd", "--system", group])
    try:
        entry = lookup_user(user)
    except KeyError:
        commands.append(["useradd", "--system", "--gid", group, "--no-create-home", "--home-dir", home,
                         "--shell", shell, "--comment", comment, user])
        return commands
    changes = []
    if gid is None or entry.pw_gid != gid:
        changes += ["--gid", group]
    if entry.pw_dir != home:
        changes += ["--home", home]
    if entry.pw_shell != shell:
        changes += ["--shell", shell]
    if entry.pw_gecos != comment:
        changes += ["--comment", comment]
    if changes:
        commands.append(["usermod"] + changes + [user])
    return commands


def sync_account(account, check_mode, run=None):
    """(group_changed, user_changed): make the account (see account_commands); in check mode only say so."""
    commands = account_commands(account, pwd.getpwnam, grp.getgrnam)
    if not check_mode:
        for argv in commands:
            result = (run or subprocess.run)(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                             timeout=120)
            if result.returncode != 0:
                raise FilesError("account %s: %s exited %d: %s" % (account.get("user"), argv[0], result.returncode,
                                                                  (result.stderr or result.stdout).strip()[:600]))
    return (any(argv[0] == "groupadd" for argv in commands),
            any(argv[0] in ("useradd", "usermod") for argv in commands))


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def validate(command, temporary, path):
    """Run the entry's validate command on the temporary file: a non-zero exit is an error naming the file, with
    the command's last output lines (the command is the role's, the file's content is never shown)."""
    if "%s" not in command:
        raise FilesError("%s: the validate command must name the file as %%s: %s" % (path, command))
    argv = [word.replace("%s", temporary) for word in shlex.split(command)]
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise FilesError("%s: the new content was not installed: validating it failed (%s)" % (path, error))
    if result.returncode != 0:
        output = " ".join((result.stderr or result.stdout).strip().splitlines()[-5:])[:600]
        raise FilesError("%s: the new content was not installed: %s exited %d%s; the old file is unchanged"
                         % (path, argv[0], result.returncode, (": " + output) if output else ""))


def text_of(data):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "(binary content)\n"


def sync_file(entry, check_mode, diffs=None):
    """Make one file hold the content, owner, group and mode asked; True when it was (or would be) changed. With
    diffs a list and the entry marked diff, a changed content adds its before and after to it."""
    path = entry["dest"]
    mode = parse_mode(entry.get("mode", "0644"), path)
    uid, gid = owner_ids(entry.get("owner", "root"), entry.get("group", "root"), path, check_mode)
    try:
        content = base64.b64decode(entry["content"], validate=True)
    except (KeyError, ValueError, TypeError):
        raise FilesError("%s: the content is not base64 (the action plugin encodes it)" % path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        # A symlink here could point a root write anywhere: refuse rather than follow it.
        raise FilesError("%s exists and is not a regular file: nothing was changed; move it away first" % path)
    same_content = info is not None and sha256_of(path) == hashlib.sha256(content).hexdigest()
    if same_content and not attributes_differ(info, uid, gid, mode):
        return False
    if diffs is not None and entry.get("diff") and not same_content:
        with open(path, "rb") if info is not None else open(os.devnull, "rb") as old:
            diffs.append({"before_header": path, "after_header": path, "before": text_of(old.read()),
                          "after": text_of(content)})
    if check_mode:
        return True
    if same_content:
        os.chown(path, uid, gid, follow_symlinks=False)
        os.chmod(path, mode)
        return True
    replace(path, uid, gid, mode, lambda out: out.write(content), entry.get("validate"))
    return True


def replace(path, uid, gid, mode, write, validate_command=None, sha256=None):
    """Replace path atomically by what write(handle) writes: a temporary file in the same directory, owner and mode
    set before a single byte is written (a key is never readable by others, not even briefly), fsync, then the
    validate command and the expected sha256 (when given) checked before the rename; the old file stays otherwise."""
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        os.fchown(handle, uid, gid)
        os.fchmod(handle, mode)
        with os.fdopen(handle, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        if validate_command:
            validate(validate_command, temporary, path)
        if sha256 is not None and sha256_of(temporary) != sha256:
            raise FilesError("%s: the file received has sha256 %s, not the %s expected: not installed, the old file "
                             "is unchanged" % (path, sha256_of(temporary), sha256))
        os.rename(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def sync_binary(entry, check_mode, transfer):
    """A large file compared by sha256: True when it was (or would be) changed; one that differs and came without
    src is appended to transfer instead (the action plugin sends it, then calls again with src)."""
    path = entry["dest"]
    mode = parse_mode(entry.get("mode", "0755"), path)
    uid, gid = owner_ids(entry.get("owner", "root"), entry.get("group", "root"), path, check_mode)
    expected = str(entry.get("sha256") or "").lower()
    if len(expected) != 64 or any(char not in "0123456789abcdef" for char in expected):
        raise FilesError("%s: sha256 %r is not a sha256 digest" % (path, entry.get("sha256")))
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise FilesError("%s exists and is not a regular file: nothing was changed; move it away first" % path)
    same_content = info is not None and sha256_of(path) == expected
    if same_content and not attributes_differ(info, uid, gid, mode):
        return False
    if check_mode:
        return True
    if same_content:
        os.chown(path, uid, gid, follow_symlinks=False)
        os.chmod(path, mode)
        return True
    source = entry.get("src")
    if not source:
        transfer.append(path)
        return False

    def write(out):
        with open(source, "rb") as handle:
            shutil.copyfileobj(handle, out, 1 << 20)

    os.makedirs(os.path.dirname(path) or "/", 0o755, exist_ok=True)
    replace(path, uid, gid, mode, write, sha256=expected)
    return True


def remove_file(path, check_mode):
    """Remove a file (or a symlink, never its target) that should not be there; True when it was (or would be)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        raise FilesError("%s is a directory, not a file to remove: nothing was changed" % path)
    if not check_mode:
        os.unlink(path)
    return True


def sync(directories, files, check_mode, diffs=None, absent=(), binaries=(), transfer=None):
    """Directories first (files go into them), then files, then binaries, then the files to remove; the paths
    changed, in order. diffs: see sync_file; transfer: a list given the binaries to send (see sync_binary)."""
    changed = []
    transfer = [] if transfer is None else transfer
    for entry in directories:
        if sync_directory(entry, check_mode):
            changed.append(entry["path"])
    for entry in files:
        parent = os.path.dirname(entry["dest"])
        if check_mode and parent in changed and not os.path.isdir(parent):
            changed.append(entry["dest"])  # its directory would be made first: the file would be new
            if diffs is not None and entry.get("diff"):
                diffs.append({"before_header": entry["dest"], "after_header": entry["dest"], "before": "",
                              "after": text_of(base64.b64decode(entry["content"]))})
            continue
        if sync_file(entry, check_mode, diffs):
            changed.append(entry["dest"])
    for entry in binaries:
        parent = os.path.dirname(entry["dest"])
        if (check_mode and parent in changed and not os.path.isdir(parent)) or sync_binary(entry, check_mode,
                                                                                             transfer):
            changed.append(entry["dest"])
    for path in absent:
        if remove_file(path, check_mode):
            changed.append(path)
    return changed


UNIT_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.@-\\"
UNIT_SUFFIXES = (".service", ".socket", ".timer", ".path", ".mount", ".target")


UNIT_DIR = "/etc/systemd/system"


def check_unit_names(units, option="units"):
    """Unit names as systemd writes them; anything else (an option, a path) is refused."""
    for name in units:
        if (not name or name[0] == "-" or not name.endswith(UNIT_SUFFIXES) or len(name) > 255
                or any(char not in UNIT_NAME for char in name)):
            raise FilesError("%s: %r is not a systemd unit name such as name.service" % (option, name))


def remove_units(units, check_mode, run=None, unit_dir=UNIT_DIR):
    """Units that should not be there: those with a file in unit_dir are stopped and disabled, their files removed,
    then one daemon-reload. The unit files removed (or that would be)."""
    check_unit_names(units, "remove_units")
    present = [name for name in units if os.path.lexists(os.path.join(unit_dir, name))]
    if not present or check_mode:
        return [os.path.join(unit_dir, name) for name in present]
    stop = ["systemctl", "disable", "--now", "--"] + present
    checked(stop, "remove_units", " ".join(stop), run, timeout=300)
    for name in present:
        remove_file(os.path.join(unit_dir, name), False)
    checked(["systemctl", "daemon-reload"], "remove_units", "systemctl daemon-reload", run, timeout=300)
    return [os.path.join(unit_dir, name) for name in present]


def parse_show(output):
    """The names that `systemctl show --property=Id,ActiveState,UnitFileState` reports active and enabled (its
    blocks are separated by an empty line, one property a line)."""
    running = []
    for block in output.split("\n\n"):
        properties = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if properties.get("ActiveState") == "active" and properties.get("UnitFileState") == "enabled":
            running.append(properties.get("Id", ""))
    return running


def units_active_enabled(units, run=None):
    """The units of the list that are active and enabled, read with one systemctl show; [] when it cannot be read
    (the role then runs its enable-and-start task, which says why)."""
    if not units:
        return []
    check_unit_names(units)
    argv = ["systemctl", "--no-pager", "show", "--property=Id,ActiveState,UnitFileState", "--"] + list(units)
    try:
        result = (run or subprocess.run)(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                         timeout=60, env=dict(os.environ, LC_ALL="C", SYSTEMD_PAGER=""))
    except (OSError, subprocess.TimeoutExpired):
        return []
    if result.returncode != 0:
        return []
    return [name for name in parse_show(result.stdout) if name in units]


RELABEL_PREFIXES = ("Relabeled ", "Would relabel ")


def checked(argv, option, shown, run=None, timeout=600):
    """Run a command that must succeed (LC_ALL=C, no stdin); FilesError naming the option and the command (`shown`)
    when it cannot run or exits non-zero. Its result."""
    try:
        result = (run or subprocess.run)(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                         timeout=timeout, env=dict(os.environ, LC_ALL="C", SYSTEMD_PAGER=""))
    except (OSError, subprocess.TimeoutExpired) as error:
        raise FilesError("%s: %s did not run: %s" % (option, shown, error))
    if result.returncode != 0:
        raise FilesError("%s: %s failed (exit %d): %s"
                         % (option, shown, result.returncode, (result.stderr or result.stdout).strip()[-400:]))
    return result


def relabel(paths, check_mode, run=None):
    """restorecon -R -v over the paths (-n in check mode: report only); the paths it relabelled or would, read from
    its lines "Relabeled PATH from OLD to NEW" and "Would relabel PATH from OLD to NEW"."""
    if not paths:
        return []
    for path in paths:
        if not path.startswith("/"):
            raise FilesError("relabel: %r is not an absolute path" % (path,))
    argv = ["restorecon", "-R", "-v"] + (["-n"] if check_mode else []) + list(paths)
    result = checked(argv, "relabel", "restorecon", run)
    relabelled = []
    for line in result.stdout.splitlines():
        for prefix in RELABEL_PREFIXES:
            if line.startswith(prefix):
                relabelled.append(line[len(prefix):].split(" from ", 1)[0])
    return relabelled


def run(params):
    """The module's result for its arguments, as the action plugin sends them (validated, defaults filled in, plus
    Ansible's `_ansible_check_mode` and `_ansible_diff`)."""
    check_mode = bool(params.get("_ansible_check_mode"))
    diffs = [] if params.get("_ansible_diff") else None
    transfer = []
    group_changed = user_changed = False
    try:
        units = params.get("units") or []
        check_unit_names(units)  # before anything changes
        check_unit_names(params.get("remove_units") or [], "remove_units")
        removed = remove_units(params.get("remove_units") or [], check_mode)
        if params.get("account"):
            group_changed, user_changed = sync_account(params["account"], check_mode)
        changed = removed + sync(params.get("directories") or [], params.get("files") or [], check_mode, diffs,
                                 params.get("absent") or [], params.get("binaries") or [], transfer)
        relabelled = relabel(params.get("relabel") or [], check_mode)
        running = units_active_enabled(units)
    except (FilesError, OSError) as error:
        return dict(failed=True, msg=str(error), changed=False, changed_paths=[])
    changed = changed + [path for path in relabelled if path not in changed]
    result = dict(changed=bool(changed) or group_changed or user_changed, changed_paths=changed, transfer=transfer,
                  group_changed=group_changed, user_changed=user_changed, units_active_enabled=running,
                  relabelled=relabelled)
    if diffs:
        result["diff"] = diffs
    return result


def main():
    result = run(json.loads(ARGUMENTS))
    sys.stdout.write(json.dumps(result))
    sys.exit(1 if result.get("failed") else 0)


if __name__ == "__main__":
    main()
