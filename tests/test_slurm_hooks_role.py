"""Tests of the slurm_hooks role's own code: the slurm.conf module and hpcobs-slurm-hooks-check.

The module (roles/slurm_hooks/library/hpcobs_slurm_conf.py) is tested through its planning function with slurm.conf
texts a site may have, and once end to end as Ansible runs it (a JSON argument file, real file on disk, check mode
and conflicts). hpcobs-slurm-hooks-check runs the real hook, as the role's validate command and readiness check do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "slurm_hooks"
MODULE_PATH = ROLE / "library" / "hpcobs_slurm_conf.py"
CHECK = ROLE / "files" / "hpcobs-slurm-hooks-check"
PROLOG_HOOK = ROLE / "files" / "hpcobs-slurm-prolog"

PROLOG = "/etc/slurm/prolog.d/*"
EPILOG = "/etc/slurm/epilog.d/*"

_spec = importlib.util.spec_from_file_location("hpcobs_slurm_conf", MODULE_PATH)
conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conf)


def plan(text, flags=("Alloc",), files=None, path="/etc/slurm/slurm.conf"):
    files = files or {}
    return conf.plan(text, PROLOG, EPILOG, list(flags), path=path, read_file=files.get)


BASE = """ClusterName=lab
SlurmctldHost=ctl
ProctrackType=proctrack/linuxproc
NodeName=gpu01 CPUs=2 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=gpu01 Default=YES
"""


def test_adds_the_three_settings_before_the_node_definitions():
    result = plan(BASE)
    assert result["conflicts"] == []
    assert result["added"] == ["Prolog=%s" % PROLOG, "Epilog=%s" % EPILOG, "PrologFlags=Alloc"]
    assert result["new_text"] == (
        "ClusterName=lab\nSlurmctldHost=ctl\nProctrackType=proctrack/linuxproc\n"
        + conf.BLOCK_COMMENT + "\n"
        + "Prolog=/etc/slurm/prolog.d/*\nEpilog=/etc/slurm/epilog.d/*\nPrologFlags=Alloc\n\n"
        + "NodeName=gpu01 CPUs=2 Gres=gpu:4 State=UNKNOWN\nPartitionName=gpu Nodes=gpu01 Default=YES\n")


def test_second_pass_changes_nothing():
    once = plan(BASE)["new_text"]
    again = plan(once)
    assert again["new_text"] == once
    assert again["added"] == [] and again["merged"] == [] and again["conflicts"] == []
    assert again["current"] == {"Prolog": [PROLOG], "Epilog": [EPILOG], "PrologFlags": ["Alloc"]}


def test_appends_at_the_end_without_node_lines_and_adds_a_missing_newline():
    result = plan("ClusterName=lab")
    assert result["new_text"] == ("ClusterName=lab\n\n" + conf.BLOCK_COMMENT + "\nProlog=%s\nEpilog=%s\nPrologFlags=Alloc\n"
                                  % (PROLOG, EPILOG))


@pytest.mark.parametrize("line,merged", [
    ("PrologFlags=Contain", "PrologFlags=Alloc,Contain"),
    ("prologflags=contain,x11  # pam_slurm_adopt", "prologflags=Alloc,contain,x11  # pam_slurm_adopt"),
    ('PrologFlags="Contain"', 'PrologFlags="Alloc,Contain"'),
    ("PrologFlags=", "PrologFlags=Alloc"),
    ("SchedulerType=sched/backfill PrologFlags=Serial MinJobAge=300",
     "SchedulerType=sched/backfill PrologFlags=Alloc,Serial MinJobAge=300"),
])
def test_merges_alloc_into_existing_flags(line, merged):
    result = plan("ClusterName=lab\n%s\nNodeName=n1 CPUs=1\n" % line)
    assert result["conflicts"] == []
    assert merged in result["new_text"].splitlines()
    assert "PrologFlags=Alloc" not in result["added"]
    assert len(result["merged"]) == 1


@pytest.mark.parametrize("line", ["PrologFlags=Alloc", "PrologFlags=Contain,ALLOC", "PROLOGFLAGS=alloc"])
def test_flags_that_already_hold_alloc_stay(line):
    result = plan("%s\nProlog=%s\nEpilog=%s\n" % (line, PROLOG, EPILOG))
    assert result["merged"] == [] and result["added"] == []
    assert result["new_text"] == "%s\nProlog=%s\nEpilog=%s\n" % (line, PROLOG, EPILOG)


def test_several_flags_are_merged_in_order():
    result = plan("PrologFlags=Contain\n", flags=("Alloc", "DeferBatch"))
    assert "PrologFlags=Alloc,DeferBatch,Contain" in result["new_text"].splitlines()


@pytest.mark.parametrize("text,key,value", [
    ("Prolog=/usr/local/sbin/site-prolog\n", "Prolog", "/usr/local/sbin/site-prolog"),
    ("Epilog=/etc/slurm/epilog.sh\n", "Epilog", "/etc/slurm/epilog.sh"),
    ("prolog=/etc/slurm/prolog.d/*.sh\n", "Prolog", "/etc/slurm/prolog.d/*.sh"),
    ('Prolog="/opt/site/prolog"\n', "Prolog", "/opt/site/prolog"),
    ("SlurmUser=slurm Epilog=/opt/x\n", "Epilog", "/opt/x"),
])
def test_a_different_prolog_or_epilog_is_a_conflict_and_nothing_changes(text, key, value):
    result = plan(BASE + text)
    assert [(c["key"], c["value"], c["line"]) for c in result["conflicts"]] == [(key, value, 6)]
    assert result["conflicts"][0]["wanted"] == (PROLOG if key == "Prolog" else EPILOG)
    assert result["conflicts"][0]["file"] == "/etc/slurm/slurm.conf"


def test_commented_out_settings_are_not_settings():
    result = plan("#Prolog=/old/prolog\n# Epilog=/old/epilog # twice\nPrologFlags=Alloc # Contain later\n")
    assert result["conflicts"] == []
    assert result["added"] == ["Prolog=%s" % PROLOG, "Epilog=%s" % EPILOG]
    assert result["current"]["PrologFlags"] == ["Alloc"]


def test_similar_keys_are_not_prolog():
    text = ("PrologSlurmctld=/etc/slurm/ctld-prolog\nPrologEpilogTimeout=60\nEpilogMsgTime=2000\n"
            "SrunProlog=/x\nTaskProlog=/y\nEpilogSlurmctld=/z\n")
    result = plan(text)
    assert result["conflicts"] == []
    assert result["added"] == ["Prolog=%s" % PROLOG, "Epilog=%s" % EPILOG, "PrologFlags=Alloc"]
    assert result["new_text"].startswith(text)


def test_included_files_are_read_and_never_edited():
    files = {
        "/etc/slurm/hooks.conf": "Prolog=%s\nEpilog=%s\nPrologFlags=Contain\n" % (PROLOG, EPILOG),
    }
    result = plan("ClusterName=lab\nInclude hooks.conf\n", files=files)
    assert result["added"] == []
    assert [c["key"] for c in result["conflicts"]] == ["PrologFlags"]
    assert result["conflicts"][0]["file"] == "/etc/slurm/hooks.conf"
    assert result["conflicts"][0]["wanted"] == "Alloc,Contain"


def test_a_site_prolog_in_an_included_file_is_a_conflict():
    files = {"/etc/slurm/site/hooks.conf": "Prolog=/opt/site/prolog\n"}
    result = plan("include /etc/slurm/site/hooks.conf\n", files=files)
    assert [(c["key"], c["file"], c["line"]) for c in result["conflicts"]] == [
        ("Prolog", "/etc/slurm/site/hooks.conf", 1)]


def test_unreadable_or_unresolvable_includes_are_reported():
    result = plan("Include missing.conf\nInclude %c-nodes.conf\n")
    assert len(result["warnings"]) == 2
    assert "cannot be read" in result["warnings"][0]
    assert "modifiers" in result["warnings"][1]


def test_include_globs_are_followed(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "a.conf").write_text("PrologFlags=Serial\n")
    (tmp_path / "conf.d" / "b.conf").write_text("Epilog=%s\n" % EPILOG)
    main = tmp_path / "slurm.conf"
    result = conf.plan("Include conf.d/*.conf\n", PROLOG, EPILOG, ["Alloc"], path=str(main))
    assert result["added"] == ["Prolog=%s" % PROLOG]
    assert [c["file"] for c in result["conflicts"]] == [str(tmp_path / "conf.d" / "a.conf")]


def test_hpcobs_prolog_plus_another_prolog_line_is_still_a_conflict():
    result = plan("Prolog=%s\nProlog=/opt/site/prolog\n" % PROLOG)
    assert [c["value"] for c in result["conflicts"]] == ["/opt/site/prolog"]


# --- The module as Ansible runs it -------------------------------------------------------------------------------

def run_module(args, check_mode=False, diff=False):
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)}
    proc = subprocess.run([sys.executable, str(MODULE_PATH)], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=60, check=False)
    return json.loads(proc.stdout)


@pytest.fixture
def slurm_conf(tmp_path):
    path = tmp_path / "slurm.conf"
    path.write_text("ClusterName=lab\nPrologFlags=Contain\nNodeName=n1 CPUs=1\n")
    os.chmod(path, 0o640)
    return path


def test_module_check_mode_reports_without_writing(slurm_conf):
    before = slurm_conf.read_text()
    result = run_module({"path": str(slurm_conf), "prolog": PROLOG, "epilog": EPILOG}, check_mode=True, diff=True)
    assert result["changed"] is True
    assert slurm_conf.read_text() == before
    assert "PrologFlags=Alloc,Contain" in result["diff"]["after"]
    assert result["merged"] == ["PrologFlags=Contain -> PrologFlags=Alloc,Contain"]


def test_module_writes_keeps_the_mode_and_is_idempotent(slurm_conf):
    args = {"path": str(slurm_conf), "prolog": PROLOG, "epilog": EPILOG}
    first = run_module(args)
    assert first["changed"] is True
    text = slurm_conf.read_text()
    assert text.splitlines() == ["ClusterName=lab", "PrologFlags=Alloc,Contain", conf.BLOCK_COMMENT,
                                 "Prolog=%s" % PROLOG, "Epilog=%s" % EPILOG, "", "NodeName=n1 CPUs=1"]
    assert os.stat(slurm_conf).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in slurm_conf.parent.iterdir()) == ["slurm.conf"]
    second = run_module(args)
    assert second["changed"] is False
    assert slurm_conf.read_text() == text


def test_module_fails_on_a_conflict_and_leaves_the_file(slurm_conf):
    slurm_conf.write_text("Prolog=/opt/site/prolog\nPrologFlags=Contain\n")
    result = run_module({"path": str(slurm_conf), "prolog": PROLOG, "epilog": EPILOG})
    assert result["failed"] is True
    assert "Prolog=/opt/site/prolog" in result["msg"] and "line 1" in result["msg"]
    assert slurm_conf.read_text() == "Prolog=/opt/site/prolog\nPrologFlags=Contain\n"
    report = run_module({"path": str(slurm_conf), "prolog": PROLOG, "epilog": EPILOG, "fail_on_conflict": False})
    assert not report.get("failed") and report["changed"] is False and len(report["conflicts"]) == 1


def test_module_refuses_a_missing_file_and_bad_values(tmp_path):
    missing = run_module({"path": str(tmp_path / "nope.conf"), "prolog": PROLOG, "epilog": EPILOG})
    assert missing["failed"] is True and "does not exist" in missing["msg"]
    (tmp_path / "slurm.conf").write_text("")
    relative = run_module({"path": str(tmp_path / "slurm.conf"), "prolog": "prolog.d/*", "epilog": EPILOG})
    assert relative["failed"] is True and "absolute path" in relative["msg"]


# --- hpcobs-slurm-hooks-check ------------------------------------------------------------------------------------

def run_check(conf_text, gpus=None, tmp_path=None):
    config = tmp_path / "slurm-hooks.conf"
    config.write_text(conf_text)
    argv = [str(CHECK), str(PROLOG_HOOK), str(config)] + ([gpus] if gpus is not None else [])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_check_passes_for_a_good_config_and_names_the_mapping_files(tmp_path):
    real = tmp_path / "real-mapping"
    real.mkdir()
    proc = run_check("MAPPING_DIR='%s'\nGPU_MAP='0:2 1:3'\nMIG_MAP='2:0.1'\nLOGGER='logger'\n" % real, "0-2", tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "mapping: 0.1 2 3\n"
    assert list(real.iterdir()) == []


def test_check_without_gpus_writes_no_mapping(tmp_path):
    proc = run_check("LOCK_SCOPE=gpu\n", None, tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "mapping: \n", "")


@pytest.mark.parametrize("conf_text,gpus,message", [
    ("GPU_MAP='0:x'\n", "0", "GPU index(es) 0 not in GPU_MAP"),
    ("LOCK_SCOPE=node\n", None, "LOCK_SCOPE must be dir or gpu"),
    ("GPU_MAP='0:1'\n", "0,1", "GPU index(es) 1 not in GPU_MAP"),
    ("LOCK_TIMEOUT=0\n", None, "LOCK_TIMEOUT must be 1-3600 seconds"),
    ("NOT A LINE\nLOCK_SCOPE=dir\n", None, "is not a working sh fragment: sh: 1: "),
    ("MIG_MAP='0:1.1\n", None, "Syntax error: Unterminated quoted string"),
    ("LOCK_SCOPE=$UNSET_VARIABLE\n", None, "UNSET_VARIABLE: parameter not set"),
])
def test_check_fails_on_what_the_hook_reports(tmp_path, conf_text, gpus, message):
    proc = run_check(conf_text, gpus, tmp_path)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert proc.stdout == ""


def test_check_usage(tmp_path):
    proc = subprocess.run([str(CHECK), str(PROLOG_HOOK)], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2 and "usage:" in proc.stderr


_probe_spec = importlib.util.spec_from_file_location("hpcobs_slurm_probe", ROLE / "library" / "hpcobs_slurm_probe.py")
probe = importlib.util.module_from_spec(_probe_spec)
_probe_spec.loader.exec_module(probe)


@pytest.mark.parametrize("renames,rc", [
    ({"rename.ul": "/usr/bin/rename.ul"}, 0),                      # Debian: util-linux's rename.ul
    ({"rename": "/usr/bin/rename.ul"}, 0),                         # EL: util-linux's rename
    ({"rename": "#!/bin/sh\necho 'perl rename 1.14'\n"}, 2),        # Perl's rename only
    ({}, 2),                                                       # none
])
def test_the_version_probe_refuses_a_node_without_util_linux_rename(tmp_path, renames, rc):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "slurmd").write_text("#!/bin/sh\necho 'slurm 24.11.5'\n")
    (bin_dir / "slurmd").chmod(0o755)
    for name, target in renames.items():
        if target.startswith("/"):
            (bin_dir / name).symlink_to(target)
        else:
            (bin_dir / name).write_text(target)
            (bin_dir / name).chmod(0o755)
    commands = ["slurmd", "scontrol", "slurmctld"]
    found_rc, version, error = probe.slurm_version(commands, str(bin_dir), need_rename=True)
    assert found_rc == rc, error
    if rc == 2:
        assert "util-linux rename" in error and version == ""
    else:
        assert version == "slurmd slurm 24.11.5" and error == ""
    # the controllers (no hooks) do not need it
    assert probe.slurm_version(commands, str(bin_dir), need_rename=False) == (0, "slurmd slurm 24.11.5", "")


def test_the_version_probe_takes_the_first_command_found_and_names_the_path_when_none_is(tmp_path):
    for name, text in (("scontrol", "slurm 23.02.7"), ("slurmctld", "slurm 24.11.5")):
        (tmp_path / name).write_text("#!/bin/sh\necho '%s'\n" % text)
        (tmp_path / name).chmod(0o755)
    assert probe.slurm_version(["slurmctld", "scontrol"], str(tmp_path), False) == (0, "slurmctld slurm 24.11.5", "")
    assert probe.slurm_version(["slurmd", "scontrol"], str(tmp_path), False) == (0, "scontrol slurm 23.02.7", "")
    assert probe.slurm_version(["slurmd"], str(tmp_path), False) == (1, "", "none of slurmd found in %s" % tmp_path)


TMPFILES_CONFIG = """# /usr/lib/tmpfiles.d/systemd.conf
d /run/user 0755 root root -
# /etc/tmpfiles.d/hpcobs-dcgm-job-mapping.conf
d /run/dcgm-job-mapping 0755 root root -
D  /run/other/ 0700 root root
"""


@pytest.mark.parametrize("directory,declared", [
    ("/run/dcgm-job-mapping", True),
    ("/run/dcgm-job-mapping/", True),
    ("/run/other", True),               # a trailing slash and D in the entry
    ("/run/dcgm-job", False),           # a prefix is not the directory
    ("/run/dcgm-job-mapping/x", False),
    ("/run/user/0", False),
])
def test_the_tmpfiles_entry_must_name_the_directory_itself(directory, declared):
    assert probe.tmpfiles_declares(TMPFILES_CONFIG, directory) is declared
    assert not probe.tmpfiles_declares("# d /run/dcgm-job-mapping 0755\n", "/run/dcgm-job-mapping"), "a comment"


def test_a_symlink_is_neither_the_textfile_directory_nor_slurm_conf(tmp_path):
    import stat as stat_module
    (tmp_path / "dir").mkdir()
    (tmp_path / "conf").write_text("")
    (tmp_path / "dir-link").symlink_to(tmp_path / "dir")
    (tmp_path / "conf-link").symlink_to(tmp_path / "conf")
    assert probe.is_kind(str(tmp_path / "dir"), stat_module.S_ISDIR)
    assert probe.is_kind(str(tmp_path / "conf"), stat_module.S_ISREG)
    assert not probe.is_kind(str(tmp_path / "dir-link"), stat_module.S_ISDIR)
    assert not probe.is_kind(str(tmp_path / "conf-link"), stat_module.S_ISREG)
    assert not probe.is_kind(str(tmp_path / "missing"), stat_module.S_ISDIR)


def test_the_probe_is_a_jsonargs_module_that_checks_its_arguments(tmp_path):
    """Sent as JSONARGS (one Python start on the host, no AnsiballZ payload): run as Ansible runs it, it imports no
    Ansible module, answers in JSON, reads nothing into check mode (it changes nothing), and refuses what
    AnsibleModule refused: an unknown or missing argument, a wrong type."""
    from tooling import REPORT_ANSIBLE_IMPORTS, jsonargs_module, run_jsonargs_module
    source = jsonargs_module(ROLE / "library" / "hpcobs_slurm_probe.py")
    (tmp_path / "slurmd").write_text("#!/bin/sh\necho 'slurm 24.11.5'\n")
    (tmp_path / "slurmd").chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    args = {"commands": ["slurmd"], "path": str(tmp_path), "need_rename": "no", "slurm_conf": str(tmp_path / "slurm.conf"),
            "textfile_dir": str(tmp_path / "slurm.conf"), "_ansible_check_mode": True, "_ansible_diff": False}
    rc, answer, stderr = run_jsonargs_module(source, args, REPORT_ANSIBLE_IMPORTS)
    assert rc == 0 and stderr == b"[]", stderr
    assert answer == {"changed": False, "version_rc": 0, "version": "slurmd slurm 24.11.5", "version_error": "",
                      "tmpfiles_declared": None, "textfile_isdir": False, "slurm_conf_isreg": True}
    for wrong, message in (
            (dict(args, colour="red"), "Unsupported parameters for (hpcobs_slurm_probe) module: colour"),
            ({"commands": ["slurmd"]}, "missing required arguments: path"),
            (dict(args, need_rename="perhaps"), "unable to convert to bool"),
            (dict(args, commands="slurmd"), "'commands' must be a non-empty list of strings"),
            (dict(args, commands=[]), "'commands' must be a non-empty list of strings"),
            (dict(args, path=["/usr/bin"]), "'path' must be a string")):
        rc, answer, _ = run_jsonargs_module(source, wrong)
        assert rc == 1 and answer["failed"] and message in answer["msg"], (wrong, answer)


def test_the_probe_takes_booleans_as_ansible_spells_them():
    base = {"commands": ["slurmd"], "path": "/usr/bin"}
    for value, wanted in ((True, True), ("yes", True), ("True", True), (1, True), ("off", False), (False, False),
                          (None, False)):
        assert probe.arguments(dict(base, need_rename=value))["need_rename"] is wanted, value
    assert probe.arguments(base) == dict(base, need_rename=False, tmpfiles_dir="", textfile_dir="", slurm_conf="")
