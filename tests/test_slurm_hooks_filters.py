"""Tests of roles/slurm_hooks/filter_plugins/hpcobs_slurm_hooks.py: sh quoting, the settings' checks, the config.

Quoted values are checked by a real shell (dash and bash --posix): what the shell reads back must be the value.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "hpcobs_slurm_hooks", REPO / "roles" / "slurm_hooks" / "filter_plugins" / "hpcobs_slurm_hooks.py"
)
f = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(f)

SHELLS = [[shutil.which("dash") or "/bin/dash"], [shutil.which("bash") or "/bin/bash", "--posix"]]

GOOD = {
    "slurm_conf_dir": "/etc/slurm",
    "slurm_conf": "/etc/slurm/slurm.conf",
    "prolog_dir": "/etc/slurm/prolog.d",
    "epilog_dir": "/etc/slurm/epilog.d",
    "bin_dir": "/usr/local/sbin",
    "prolog_flags": ["Alloc"],
    "slurm_bin_dirs": [],
    "mapping_dir": "/run/hpcobs/dcgm-job-mapping",
    "textfile_dir": "/var/lib/node_exporter/textfile",
    "gpu_map": {},
    "mig_map": {},
    "lock_scope": "dir",
    "lock_timeout": 10,
    "log_tag": "hpcobs-slurm-hooks",
    "logger": "logger",
}


def read_back(shell, assignment: str) -> str:
    """What SHELL assigns to V when it evaluates ASSIGNMENT (V=<quoted>)."""
    p = subprocess.run([*shell, "-c", assignment + "\nprintf '%s' \"$V\""], capture_output=True, text=True,
                       timeout=30, check=False)
    assert (p.returncode, p.stderr) == (0, ""), p
    return p.stdout


@pytest.mark.parametrize("shell", SHELLS, ids=["dash", "bash-posix"])
@pytest.mark.parametrize("value", [
    "a b",
    "",
    "it's",
    "''",
    "'\\''",
    '"double" quotes',
    "$(touch /tmp/hpcobs-quote-test) `touch /tmp/hpcobs-quote-test` ${HOME} $HOME $1 $$",
    "back\\slash\\",
    "glob * ? [a-z]",
    "semi; colon && pipe | amp & <redir >",
    "tab\tand # hash",
    "jörg",
])
def test_sh_quote_gives_the_value_back(shell, value):
    assert read_back(shell, "V=" + f.sh_quote(value)) == value
    assert not Path("/tmp/hpcobs-quote-test").exists()


def test_sh_quote_spelling():
    assert f.sh_quote("a b") == "'a b'"
    assert f.sh_quote("it's") == "'it'\\''s'"
    assert f.sh_quote(10) == "'10'"
    assert f.sh_quote("") == "''"


@pytest.mark.parametrize("value,what", [
    ("a\nb", "a newline"),
    ("LOG_TAG=x\nrm -rf /", "a newline"),
    ("a\rb", "a carriage return"),
    ("a\0b", "a NUL"),
])
def test_sh_quote_refuses_what_a_config_line_cannot_hold(value, what):
    with pytest.raises(f.AnsibleFilterError, match=what):
        f.sh_quote(value)


@pytest.mark.parametrize("value", [True, None, ["a"], {"a": 1}, 1.5])
def test_sh_quote_refuses_non_scalars(value):
    with pytest.raises(f.AnsibleFilterError, match="expected a string or an integer"):
        f.sh_quote(value)


def test_good_settings_have_no_problem():
    assert f.slurm_hooks_problems(GOOD) == []
    assert f.slurm_hooks_problems(dict(GOOD, mapping_dir="", textfile_dir="")) == []
    assert f.slurm_hooks_problems(dict(GOOD, gpu_map={0: 2, "1": 3}, mig_map={2: "0.1", "3": "0.2"})) == []
    assert f.slurm_hooks_problems(dict(GOOD, lock_timeout="3600", lock_scope="gpu")) == []


@pytest.mark.parametrize("change,message", [
    ({"log_tag": "a b"}, "slurm_hooks_log_tag must be letters, digits and ._-"),
    ({"log_tag": ""}, "slurm_hooks_log_tag"),
    ({"logger": "/bin/echo hi"}, "slurm_hooks_logger must be a command name or path"),
    ({"lock_scope": "node"}, "slurm_hooks_lock_scope must be dir or gpu"),
    ({"lock_timeout": 0}, "slurm_hooks_lock_timeout must be 1-3600"),
    ({"lock_timeout": "ten"}, "slurm_hooks_lock_timeout"),
    ({"lock_timeout": True}, "slurm_hooks_lock_timeout"),
    ({"lock_timeout": 3601}, "slurm_hooks_lock_timeout"),
    ({"mapping_dir": "relative/dir"}, "slurm_hooks_mapping_dir must be empty or an absolute path"),
    ({"mapping_dir": "$(reboot)"}, "slurm_hooks_mapping_dir"),
    ({"textfile_dir": "/var/lib/node exporter"}, "slurm_hooks_textfile_dir"),
    ({"textfile_dir": "/var/lib/../etc"}, "slurm_hooks_textfile_dir"),
    ({"mapping_dir": "/run"}, "slurm_hooks_mapping_dir must be a directory of its own"),
    ({"mapping_dir": "/run/.staging/map"}, "slurm_hooks_mapping_dir must not lie in a .staging directory"),
    ({"textfile_dir": "/var/lib/textfile/.staging"}, "slurm_hooks_textfile_dir must not lie in a .staging"),
    ({"textfile_dir": "/run/hpcobs/dcgm-job-mapping"}, "must differ"),
    ({"epilog_dir": "/etc/slurm/prolog.d"}, "slurm_hooks_prolog_dir and slurm_hooks_epilog_dir must differ"),
    ({"prolog_dir": "/etc/slurm/prolog.d/"}, "slurm_hooks_prolog_dir must be an absolute path"),
    ({"slurm_conf": "slurm.conf"}, "slurm_hooks_slurm_conf must be an absolute path"),
    ({"prolog_flags": ["Alloc,Contain"]}, "slurm_hooks_prolog_flags"),
    ({"slurm_bin_dirs": ["opt/slurm"]}, "slurm_hooks_slurm_bin_dirs"),
    ({"gpu_map": {0: "a"}}, "slurm_hooks_gpu_map entry 0"),
    ({"gpu_map": {0: "1"}}, "slurm_hooks_gpu_map entry 0"),
    ({"gpu_map": {"01": 1}}, "slurm_hooks_gpu_map entry '01'"),
    ({"gpu_map": {0: True}}, "slurm_hooks_gpu_map entry 0"),
    ({"gpu_map": {0: 1, 1: 1}}, "['1'] are the target of more than one Slurm index"),
    ({"gpu_map": {0: 1, "0": 2}}, "index(es) [0] appear more than once"),
    ({"mig_map": {0: 1}}, "slurm_hooks_mig_map entry 0"),
    ({"mig_map": {0: "0.1.2"}}, "slurm_hooks_mig_map entry 0"),
    ({"gpu_map": {0: 1}, "mig_map": {0: "1.1"}}, "index(es) [0] appear more than once"),
    ({"gpu_map": []}, "must be mappings"),
])
def test_bad_settings_are_named(change, message):
    problems = f.slurm_hooks_problems(dict(GOOD, **change))
    assert len(problems) == 1, problems
    assert message in problems[0]


def test_maps_are_checked_only_where_the_hooks_are_installed():
    bad = dict(GOOD, gpu_map={0: "x"})
    assert f.slurm_hooks_problems(bad, install=False) == []
    assert len(f.slurm_hooks_problems(bad, install=True)) == 1


def test_every_problem_is_reported_at_once():
    problems = f.slurm_hooks_problems(dict(GOOD, log_tag="a b", lock_scope="x", lock_timeout=0))
    assert len(problems) == 3


def test_the_config_text():
    text = f.slurm_hooks_conf(dict(GOOD, gpu_map={10: 3, 2: 0, "1": 1}, mig_map={0: "0.1"}, lock_timeout="5"))
    assert text == (
        "MAPPING_DIR='/run/hpcobs/dcgm-job-mapping'\n"
        "TEXTFILE_DIR='/var/lib/node_exporter/textfile'\n"
        "GPU_MAP='1:1 2:0 10:3'\n"
        "MIG_MAP='0:0.1'\n"
        "LOCK_SCOPE='dir'\n"
        "LOCK_TIMEOUT='5'\n"
        "LOG_TAG='hpcobs-slurm-hooks'\n"
        "LOGGER='logger'\n"
    )


@pytest.mark.parametrize("shell", SHELLS, ids=["dash", "bash-posix"])
def test_the_config_is_what_a_shell_reads(shell):
    text = f.slurm_hooks_conf(dict(GOOD, gpu_map={0: 2, 1: 3}, mapping_dir=""))
    p = subprocess.run([*shell, "-c", text + 'printf "%s|%s|%s" "$MAPPING_DIR" "$GPU_MAP" "$LOCK_TIMEOUT"'],
                       capture_output=True, text=True, timeout=30, check=False)
    assert (p.returncode, p.stderr, p.stdout) == (0, "", "|0:2 1:3|10")


def test_the_config_refuses_bad_settings():
    with pytest.raises(f.AnsibleFilterError, match="slurm_hooks_log_tag"):
        f.slurm_hooks_conf(dict(GOOD, log_tag="a b"))


def test_filters_are_registered():
    assert set(f.FilterModule().filters()) == {
        "hpcobs_sh_quote", "hpcobs_slurm_hooks_problems", "hpcobs_slurm_hooks_conf"}
