"""Filters of the slurm_hooks role: its settings checked, and the hooks' config rendered as sh assignments.

    hpcobs_sh_quote            a value as one POSIX sh word ('...'; a newline, carriage return or NUL is refused)
    hpcobs_slurm_hooks_problems  every problem of the role's settings, as sentences ([] when all is well)
    hpcobs_slurm_hooks_conf    the hooks' config file: one KEY='value' line per setting (refuses bad settings)

The hooks source that file as sh, so every value goes through hpcobs_sh_quote and the checks here are the only
validation of the values (the hooks only guard what they need to run safely).
Pure functions, unit tested in tests/test_slurm_hooks_filters.py.
"""

from __future__ import annotations

import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # the unit tests run without Ansible too
    AnsibleFilterError = ValueError

PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+-]*[A-Za-z0-9._@+-]$")
DATA_DIR_RE = re.compile(r"^/[A-Za-z0-9._/@:+-]*[A-Za-z0-9._@:+-]$")
BIN_DIR_RE = re.compile(r"^/[A-Za-z0-9._/+-]*$")
DOT_PART_RE = re.compile(r"(^|/)\.\.?(/|$)")
STAGING_PART_RE = re.compile(r"(^|/)\.staging(/|$)")  # the hooks rename <dir>/.staging/<name> to <dir>/<name>
FLAG_RE = re.compile(r"^[A-Za-z]+$")
TAG_RE = re.compile(r"^[A-Za-z0-9._-]+$")
LOGGER_RE = re.compile(r"^[A-Za-z0-9/._+-]+$")
NUMBER_RE = re.compile(r"^(0|[1-9][0-9]{0,5})$")
MIG_RE = re.compile(r"^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$")
SYSTEM_DIRS = {"/", "/etc", "/run", "/var", "/var/lib", "/tmp", "/usr", "/var/run"}

# Config keys, in the order they are written, and the setting each comes from.
CONF_KEYS = [
    ("MAPPING_DIR", "mapping_dir"),
    ("TEXTFILE_DIR", "textfile_dir"),
    ("GPU_MAP", "gpu_map"),
    ("MIG_MAP", "mig_map"),
    ("LOCK_SCOPE", "lock_scope"),
    ("LOCK_TIMEOUT", "lock_timeout"),
    ("LOG_TAG", "log_tag"),
    ("LOGGER", "logger"),
]


def sh_quote(value) -> str:
    """VALUE as a single POSIX sh word: in single quotes, each ' written as '\\''.

    Strings and integers only (a bool, None, list or mapping is a mistake upstream). A newline, carriage return or
    NUL is refused: the config is one setting per line and sh strings cannot hold NUL.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise AnsibleFilterError(f"hpcobs_sh_quote: expected a string or an integer, got {type(value).__name__}")
    text = str(value)
    for char, name in (("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL")):
        if char in text:
            raise AnsibleFilterError(f"hpcobs_sh_quote: {text!r} contains {name}, which a config line cannot hold")
    return "'" + text.replace("'", "'\\''") + "'"


def _number(value):
    """An int from an int or a digit string (YAML keys are ints, extra-vars keys strings); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= 999999 else None
    if isinstance(value, str) and NUMBER_RE.match(value):
        return int(value)
    return None


def _map_problems(gpu_map, mig_map) -> list[str]:
    problems = []
    if not isinstance(gpu_map, dict) or not isinstance(mig_map, dict):
        return [f"slurm_hooks_gpu_map and slurm_hooks_mig_map must be mappings (got {gpu_map!r} and {mig_map!r})"]
    indices, targets = [], []
    for key, value in gpu_map.items():
        index, gpu = _number(key), value if isinstance(value, int) and not isinstance(value, bool) else None
        if index is None or gpu is None or _number(gpu) is None:
            problems.append(f"slurm_hooks_gpu_map entry {key!r}: {value!r} must map a Slurm GPU index to a"
                            " dcgm-exporter gpu id, both numbers without leading zeros (e.g. {0: 2})")
            continue
        indices.append(index)
        targets.append(str(gpu))
    for key, value in mig_map.items():
        index = _number(key)
        if index is None or not isinstance(value, str) or not MIG_RE.match(value):
            problems.append(f"slurm_hooks_mig_map entry {key!r}: {value!r} must map a Slurm GPU index to a quoted"
                            ' "<gpu>.<gpu instance id>" string (e.g. {0: "0.1"})')
            continue
        indices.append(index)
        targets.append(value)
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        problems.append(f"Slurm GPU index(es) {twice} appear more than once across slurm_hooks_gpu_map and"
                        " slurm_hooks_mig_map")
    shared = sorted({t for t in targets if targets.count(t) > 1})
    if shared:
        problems.append(f"GPU or MIG instance(s) {shared} are the target of more than one Slurm index")
    return problems


def slurm_hooks_problems(settings: dict, install: bool = True) -> list[str]:
    """Every problem of the role's settings (keys without the slurm_hooks_ prefix); the maps only with INSTALL."""
    s = settings
    problems = []
    for name in ("slurm_conf_dir", "slurm_conf", "prolog_dir", "epilog_dir", "bin_dir"):
        value = s.get(name)
        if not isinstance(value, str) or not PATH_RE.match(value) or DOT_PART_RE.search(value):
            problems.append(f"slurm_hooks_{name} must be an absolute path of letters, digits and ._/@+- without . or"
                            f" .. parts (got {value!r})")
    for name in ("mapping_dir", "textfile_dir"):
        value = s.get(name)
        if value == "":
            continue
        if not isinstance(value, str) or not DATA_DIR_RE.match(value) or DOT_PART_RE.search(value):
            problems.append(f"slurm_hooks_{name} must be empty or an absolute path of letters, digits and ._/@:+-"
                            f" without . or .. parts (got {value!r})")
        elif STAGING_PART_RE.search(value):
            problems.append(f"slurm_hooks_{name} must not lie in a .staging directory (the hooks' own; got {value!r})")
        elif value in SYSTEM_DIRS:
            problems.append(f"slurm_hooks_{name} must be a directory of its own, not {value}")
    if s.get("mapping_dir") and s.get("mapping_dir") == s.get("textfile_dir"):
        problems.append("slurm_hooks_mapping_dir and slurm_hooks_textfile_dir must differ")
    if s.get("prolog_dir") == s.get("epilog_dir"):
        problems.append("slurm_hooks_prolog_dir and slurm_hooks_epilog_dir must differ")
    flags = s.get("prolog_flags")
    if not isinstance(flags, list) or not all(isinstance(f, str) and FLAG_RE.match(f) for f in flags):
        problems.append(f"slurm_hooks_prolog_flags must be a list of flag names such as Alloc (got {flags!r})")
    if s.get("lock_scope") not in ("dir", "gpu"):
        problems.append(f"slurm_hooks_lock_scope must be dir or gpu (got {s.get('lock_scope')!r})")
    timeout = _number(s.get("lock_timeout"))
    if timeout is None or not 1 <= timeout <= 3600:
        problems.append(f"slurm_hooks_lock_timeout must be 1-3600 seconds (got {s.get('lock_timeout')!r})")
    tag = s.get("log_tag")
    if not isinstance(tag, str) or not TAG_RE.match(tag):
        problems.append(f"slurm_hooks_log_tag must be letters, digits and ._- (a syslog tag ends at a space;"
                        f" got {tag!r})")
    logger = s.get("logger")
    if not isinstance(logger, str) or not LOGGER_RE.match(logger):
        problems.append(f"slurm_hooks_logger must be a command name or path, without arguments (got {logger!r})")
    bin_dirs = s.get("slurm_bin_dirs")
    if not isinstance(bin_dirs, list) or not all(isinstance(d, str) and BIN_DIR_RE.match(d) for d in bin_dirs):
        problems.append(f"slurm_hooks_slurm_bin_dirs must be a list of absolute paths (got {bin_dirs!r})")
    if install:
        problems += _map_problems(s.get("gpu_map"), s.get("mig_map"))
    return problems


def _map_text(mapping: dict) -> str:
    """{1: 3, 0: 2} -> "0:2 1:3" (sorted by Slurm index), as the hooks look it up."""
    return " ".join(f"{_number(k)}:{v}" for k, v in sorted(mapping.items(), key=lambda kv: _number(kv[0])))


def slurm_hooks_conf(settings: dict) -> str:
    """The hooks' config: one KEY='value' line per setting, in CONF_KEYS order, ending with a newline."""
    problems = slurm_hooks_problems(settings)
    if problems:
        raise AnsibleFilterError("hpcobs_slurm_hooks_conf: " + "; ".join(problems))
    values = dict(settings)
    values["gpu_map"] = _map_text(settings["gpu_map"])
    values["mig_map"] = _map_text(settings["mig_map"])
    values["lock_timeout"] = _number(settings["lock_timeout"])
    return "".join(f"{key}={sh_quote(values[name])}\n" for key, name in CONF_KEYS)


class FilterModule:
    def filters(self):
        return {
            "hpcobs_sh_quote": sh_quote,
            "hpcobs_slurm_hooks_problems": slurm_hooks_problems,
            "hpcobs_slurm_hooks_conf": slurm_hooks_conf,
        }
