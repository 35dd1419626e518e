"""roles/service's hpcobs_files: the module (one run for a service's directories and small files) and what its
action plugin does on the controller before the host is touched. The roles' use of it converges in every scenario
with the security switch on (the TLS set and web configuration of each exporter)."""
import base64
import importlib.util
import os
import stat
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "playbooks", "filter_plugins"))

import hpcobs_service  # noqa: E402
from tooling import REPORT_ANSIBLE_IMPORTS, jsonargs_module, run_jsonargs_module  # noqa: E402


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULE = load("hpcobs_files_module", "roles/service/library/hpcobs_files.py")
ACTION = load("hpcobs_files_action", "roles/service/action_plugins/hpcobs_files.py")
ME = __import__("pwd").getpwuid(os.getuid()).pw_name
MY_GROUP = __import__("grp").getgrgid(os.getgid()).gr_name


def entry(dest, data, mode="0640"):
    return {"dest": str(dest), "content": base64.b64encode(data).decode(), "owner": ME, "group": MY_GROUP,
            "mode": mode}


def test_a_new_set_is_made_then_a_rerun_changes_nothing(tmp_path):
    tls = tmp_path / "tls"
    directories = [{"path": str(tls), "owner": ME, "group": MY_GROUP, "mode": "0750"}]
    files = [entry(tls / "ca.crt", b"CA\n", "0644"), entry(tls / "server.key", b"KEY\n", "0640")]
    assert MODULE.sync(directories, files, check_mode=False) == [str(tls), str(tls / "ca.crt"),
                                                                   str(tls / "server.key")]
    assert stat.S_IMODE(os.stat(tls).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(tls / "server.key").st_mode) == 0o640
    assert (tls / "server.key").read_bytes() == b"KEY\n"
    assert MODULE.sync(directories, files, check_mode=False) == []
    assert sorted(os.listdir(tls)) == ["ca.crt", "server.key"], "no temporary file is left behind"


def test_missing_parents_are_made_and_a_directory_listed_twice_is_one_change(tmp_path):
    hooks = tmp_path / "slurm" / "prolog.d"
    wanted = {"path": str(hooks), "owner": ME, "group": MY_GROUP, "mode": "0755"}
    assert MODULE.sync([wanted, wanted], [], check_mode=False) == [str(hooks)]
    assert hooks.is_dir() and stat.S_IMODE(os.stat(hooks).st_mode) == 0o755


def test_check_mode_names_what_would_change_and_writes_nothing(tmp_path):
    tls = tmp_path / "tls"
    directories = [{"path": str(tls), "owner": ME, "group": MY_GROUP, "mode": "0750"}]
    assert MODULE.sync(directories, [entry(tls / "ca.crt", b"CA")], check_mode=True) == [str(tls),
                                                                                          str(tls / "ca.crt")]
    assert not tls.exists()
    target = tmp_path / "web.yml"
    target.write_bytes(b"old")
    assert MODULE.sync([], [entry(target, b"new")], check_mode=True) == [str(target)]
    assert target.read_bytes() == b"old"


def test_a_changed_content_is_replaced_and_a_wrong_mode_is_fixed_in_place(tmp_path):
    target = tmp_path / "web.yml"
    target.write_bytes(b"old")
    os.chmod(target, 0o644)
    assert MODULE.sync([], [entry(target, b"old", "0640")], check_mode=False) == [str(target)]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640 and target.read_bytes() == b"old"
    inode = os.stat(target).st_ino
    assert MODULE.sync([], [entry(target, b"new", "0640")], check_mode=False) == [str(target)]
    assert target.read_bytes() == b"new" and os.stat(target).st_ino != inode, "replaced by rename, not rewritten"


def test_a_symlink_or_a_directory_in_the_way_is_refused_and_left_alone(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"precious")
    link = tmp_path / "server.key"
    link.symlink_to(elsewhere)
    with pytest.raises(MODULE.FilesError, match="not a regular file"):
        MODULE.sync([], [entry(link, b"KEY")], check_mode=False)
    assert elsewhere.read_bytes() == b"precious" and link.is_symlink()
    (tmp_path / "plain").write_bytes(b"x")
    with pytest.raises(MODULE.FilesError, match="not a directory"):
        MODULE.sync([{"path": str(tmp_path / "plain"), "owner": ME, "group": MY_GROUP}], [], check_mode=False)


def test_an_account_made_later_in_the_run_is_a_change_in_check_mode_and_an_error_otherwise(tmp_path):
    wanted = {"path": str(tmp_path / "tls"), "owner": "root", "group": "hpcobs-no-such-group", "mode": "0750"}
    assert MODULE.sync([wanted], [], check_mode=True) == [str(tmp_path / "tls")]
    with pytest.raises(MODULE.FilesError, match="group 'hpcobs-no-such-group' does not exist"):
        MODULE.sync([wanted], [], check_mode=False)
    assert not (tmp_path / "tls").exists()


def test_a_content_that_fails_its_validate_command_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "promtail.yml"
    target.write_bytes(b"good: true\n")
    refuse = dict(entry(target, b"bad\n"), validate="/bin/sh -c 'grep -q good \"$1\" || { echo \"line 1: not good\" >&2; exit 3; }' v %s")
    with pytest.raises(MODULE.FilesError, match=r"promtail.yml: the new content was not installed: /bin/sh exited 3: "
                                                r"line 1: not good; the old file is unchanged"):
        MODULE.sync([], [refuse], check_mode=False)
    assert target.read_bytes() == b"good: true\n" and os.listdir(tmp_path) == ["promtail.yml"]
    accept = dict(refuse, content=base64.b64encode(b"good: yes\n").decode())
    assert MODULE.sync([], [accept], check_mode=False) == [str(target)]
    assert target.read_bytes() == b"good: yes\n"
    # the validator sees the new content in a file of the same directory, with the final mode
    seen = tmp_path / "seen"
    probe = dict(entry(target, b"third\n", "0600"),
                 validate="/bin/sh -c 'stat -c %a \"$1\" > \"$2\".mode; cat \"$1\" > \"$2\"' v %s " + str(seen))
    assert MODULE.sync([], [probe], check_mode=False) == [str(target)]
    assert seen.read_bytes() == b"third\n" and (tmp_path / "seen.mode").read_text() == "600\n"
    with pytest.raises(MODULE.FilesError, match="must name the file as %s"):
        MODULE.sync([], [dict(entry(target, b"fourth\n"), validate="/bin/true")], check_mode=False)


def test_a_validate_command_is_not_run_in_check_mode_nor_for_a_file_already_right(tmp_path):
    target = tmp_path / "hooks.conf"
    target.write_bytes(b"same\n")
    os.chmod(target, 0o640)
    never = dict(entry(target, b"same\n"), validate="/bin/false %s")
    assert MODULE.sync([], [never], check_mode=False) == []
    assert MODULE.sync([], [dict(never, content=base64.b64encode(b"other\n").decode())], check_mode=True) == [str(target)]
    assert target.read_bytes() == b"same\n"


def test_a_diff_is_given_only_for_files_marked_so(tmp_path):
    unit = tmp_path / "node_exporter.service"
    unit.write_bytes(b"[Service]\nExecStart=/old\n")
    secret = tmp_path / "ipmi.yml"
    secret.write_bytes(b"password: old\n")
    fresh = tmp_path / "new.d" / "fresh.conf"
    diffs = []
    changed = MODULE.sync([{"path": str(fresh.parent), "owner": ME, "group": MY_GROUP}],
                          [dict(entry(unit, b"[Service]\nExecStart=/new\n"), diff=True),
                           entry(secret, b"password: new\n"),
                           dict(entry(fresh, b"x = 1\n"), diff=True)], check_mode=True, diffs=diffs)
    assert changed == [str(fresh.parent), str(unit), str(secret), str(fresh)]
    assert diffs == [{"before_header": str(unit), "after_header": str(unit), "before": "[Service]\nExecStart=/old\n",
                      "after": "[Service]\nExecStart=/new\n"},
                     {"before_header": str(fresh), "after_header": str(fresh), "before": "", "after": "x = 1\n"}]
    assert all("password" not in text for d in diffs for text in d.values())


def test_a_file_to_remove_goes_a_symlink_goes_without_its_target_and_a_directory_is_refused(tmp_path):
    stale = tmp_path / "hpcobs-slurm-hooks.conf"
    stale.write_bytes(b"d /run/x\n")
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert MODULE.sync([], [], check_mode=True, absent=[str(stale), str(link)]) == [str(stale), str(link)]
    assert stale.exists() and link.is_symlink()
    assert MODULE.sync([], [], check_mode=False, absent=[str(stale), str(link), str(tmp_path / "gone")]) == [
        str(stale), str(link)]
    assert not stale.exists() and not link.is_symlink() and target.read_bytes() == b"keep"
    with pytest.raises(MODULE.FilesError, match="is a directory, not a file to remove"):
        MODULE.sync([], [], check_mode=False, absent=[str(tmp_path)])


def test_service_dirs_become_directory_entries_with_the_service_group():
    assert hpcobs_service.directory_entries(
        [{"path": "/var/lib/node_exporter/textfile"}, {"path": "/etc/node_exporter", "mode": "0750"},
         {"path": "/srv/x", "owner": "promtail", "group": "adm", "mode": "0700"}], "node_exporter") == [
        {"path": "/var/lib/node_exporter/textfile", "owner": "root", "group": "node_exporter", "mode": "0755"},
        {"path": "/etc/node_exporter", "owner": "root", "group": "node_exporter", "mode": "0750"},
        {"path": "/srv/x", "owner": "promtail", "group": "adm", "mode": "0700"}]
    assert hpcobs_service.directory_entries(["/etc/slurm/prolog.d"], "root") == [
        {"path": "/etc/slurm/prolog.d", "owner": "root", "group": "root", "mode": "0755"}]
    with pytest.raises(hpcobs_service.AnsibleFilterError, match="/x has unknown keys recurse"):
        hpcobs_service.directory_entries([{"path": "/x", "recurse": True}], "g")
    with pytest.raises(hpcobs_service.AnsibleFilterError, match="has no path"):
        hpcobs_service.directory_entries([{"mode": "0755"}], "g")


@pytest.mark.parametrize("mode", ["rw-r-----", "0999", "", "12345"])
def test_a_mode_that_is_not_octal_is_refused(mode, tmp_path):
    with pytest.raises(MODULE.FilesError, match="not an octal mode"):
        MODULE.sync([], [entry(tmp_path / "f", b"x", mode)], check_mode=False)


def test_the_action_plugin_reads_sources_and_skips_only_in_check_mode():
    sources = {"/pki/ca.crt": b"CA"}
    files = [{"dest": "/etc/x/ca.crt", "src": "/pki/ca.crt", "mode": "0644"},
             {"dest": "/etc/x/server.key", "src": "/pki/hosts/n1.key", "mode": "0640"},
             {"dest": "/etc/x/web.yml", "content": "tls_server_config: {}\n", "mode": "0640"}]
    encoded, skipped = ACTION.encode_files(files, True, sources.get)
    assert skipped == ["/etc/x/server.key"]
    assert [base64.b64decode(item["content"]) for item in encoded] == [b"CA", b"tls_server_config: {}\n"]
    assert all("src" not in item for item in encoded)
    with pytest.raises(ACTION.AnsibleActionFail, match="server.key: its source /pki/hosts/n1.key does not exist"):
        ACTION.encode_files(files, False, sources.get)


def test_the_action_plugin_refuses_a_malformed_entry_before_the_host_is_touched():
    with pytest.raises(ACTION.AnsibleActionFail, match="exactly one of src and content"):
        ACTION.encode_files([{"dest": "/a", "src": "/b", "content": "c"}], False, lambda src: b"")
    with pytest.raises(ACTION.AnsibleActionFail, match=r"files\[0\] has unknown keys backup"):
        ACTION.check_entries([{"dest": "/a", "backup": True}], ACTION.FILE_KEYS, "dest", "files")
    with pytest.raises(ACTION.AnsibleActionFail, match=r"directories\[0\] has no path"):
        ACTION.check_entries([{"mode": "0750"}], ACTION.DIRECTORY_KEYS, "path", "directories")


def test_the_tls_set_of_a_service():
    files = hpcobs_service.tls_files("/etc/node_exporter/tls", "node_exporter", "/pki/ca.crt", "/pki/hosts/n.crt",
                                     "/pki/hosts/n.key", True, ["loki-push-n"], "/pki", "0640")
    assert [(f["dest"], f["src"], f["mode"]) for f in files] == [
        ("/etc/node_exporter/tls/ca.crt", "/pki/ca.crt", "0644"),
        ("/etc/node_exporter/tls/server.crt", "/pki/hosts/n.crt", "0644"),
        ("/etc/node_exporter/tls/server.key", "/pki/hosts/n.key", "0640"),
        ("/etc/node_exporter/tls/loki-push-n", "/pki/credentials/loki-push-n", "0640")]
    assert {(f["owner"], f["group"]) for f in files} == {("root", "node_exporter")}
    client_only = hpcobs_service.tls_files("/etc/loki/tls", "loki", "/pki/ca.crt", server=False)
    assert [f["dest"] for f in client_only] == ["/etc/loki/tls/ca.crt"]


@pytest.mark.parametrize("tls_dir,group,credentials,message", [
    ("etc/tls", "g", [], "absolute path"),
    ("/etc/tls", "", [], "service_group is empty"),
    ("/etc/tls", "g", ["../../etc/shadow"], "not a credential name"),
    ("/etc/tls", "g", [".."], "not a credential name"),
])
def test_the_tls_set_refuses_what_would_write_elsewhere(tls_dir, group, credentials, message):
    with pytest.raises(hpcobs_service.AnsibleFilterError, match=message):
        hpcobs_service.tls_files(tls_dir, group, "/pki/ca.crt", "/c", "/k", True, credentials, "/pki")


def test_a_tree_of_role_files_keeps_its_layout_under_the_destination():
    got = hpcobs_service.tree(["pkg/__init__.py", "pkg/data/x.txt", "pkg/data/y.txt"], "/usr/local/lib/sim/")
    assert [d["path"] for d in got["directories"]] == ["/usr/local/lib/sim", "/usr/local/lib/sim/pkg",
                                                      "/usr/local/lib/sim/pkg/data"]
    assert [(f["src"], f["dest"], f["mode"]) for f in got["files"]] == [
        ("pkg/__init__.py", "/usr/local/lib/sim/pkg/__init__.py", "0644"),
        ("pkg/data/x.txt", "/usr/local/lib/sim/pkg/data/x.txt", "0644"),
        ("pkg/data/y.txt", "/usr/local/lib/sim/pkg/data/y.txt", "0644")]


@pytest.mark.parametrize("path", ["/etc/passwd", "pkg/../../etc/passwd", "pkg//x", "./x"])
def test_a_tree_refuses_a_path_that_leaves_its_root(path):
    with pytest.raises(hpcobs_service.AnsibleFilterError, match="not a plain relative path"):
        hpcobs_service.tree([path], "/usr/local/lib/sim")


def test_the_simulator_installs_every_file_of_its_package():
    import yaml
    files_dir = os.path.join(ROOT, "roles", "lab_gpu_simulator", "files")
    present = sorted(os.path.relpath(os.path.join(directory, name), files_dir)
                     for directory, _, names in os.walk(os.path.join(files_dir, "hpcobs_gpusim"))
                     if "__pycache__" not in directory for name in names if not name.endswith(".pyc"))
    listed = yaml.safe_load(open(os.path.join(ROOT, "roles", "lab_gpu_simulator", "vars", "main.yml")))
    assert sorted(listed["_lab_gpu_simulator_package_files"]) == present, \
        "roles/lab_gpu_simulator/vars/main.yml _lab_gpu_simulator_package_files must list the package's files"


def run_play(tmp_path, play, *options):
    """ansible-playbook on localhost with roles/service's module and action plugin, as a role that imports
    roles/service has them; returns (rc, output)."""
    import subprocess
    import yaml
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LIBRARY=os.path.join(ROOT, "roles", "service", "library"),
               ANSIBLE_ACTION_PLUGINS=os.path.join(ROOT, "roles", "service", "action_plugins"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"))
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                             "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
                             str(tmp_path / "play.yml"), *options],
                            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_through_ansible_a_rendered_unit_is_diffed_in_check_mode_and_a_failing_validate_stops_the_task(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "x.service.j2").write_text("[Service]\nExecStart={{ exec }}\n")
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\nExecStart=/old\n")
    task = {"hpcobs_files": {"files": [{"dest": str(unit), "content": "{{ lookup('ansible.builtin.template', "
                                        "'x.service.j2') }}", "owner": ME, "group": MY_GROUP, "mode": "0644",
                                        "diff": True}]}}
    play = [{"hosts": "localhost", "gather_facts": False, "vars": {"exec": "/usr/local/bin/x"}, "tasks": [task]}]
    rc, out = run_play(tmp_path, play, "--check", "--diff")
    assert rc == 0, out
    assert "-ExecStart=/old" in out and "+ExecStart=/usr/local/bin/x" in out, out
    assert unit.read_text() == "[Service]\nExecStart=/old\n", "check mode wrote nothing"
    rc, out = run_play(tmp_path, play)
    assert rc == 0 and "changed=1" in out, out
    assert unit.read_text() == "[Service]\nExecStart=/usr/local/bin/x\n"
    rc, out = run_play(tmp_path, play)
    assert rc == 0 and "changed=0" in out, out
    task["hpcobs_files"]["files"][0]["validate"] = "/bin/sh -c 'echo refused by the check >&2; exit 1' v %s"
    rc, out = run_play(tmp_path, [dict(play[0], vars={"exec": "/bad"})])
    assert rc != 0 and "the new content was not installed: /bin/sh exited 1: refused by the check" in out, out
    assert unit.read_text() == "[Service]\nExecStart=/usr/local/bin/x\n", "the old unit stays"


def test_through_ansible_a_unit_name_that_is_not_one_fails_before_a_file_is_written(tmp_path):
    unit = tmp_path / "x.service"
    unit.write_text("old\n")
    entry = {"dest": str(unit), "content": "new\n", "owner": ME, "group": MY_GROUP, "mode": "0644"}
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"hpcobs_files": {"files": [entry], "units": ["--all"]}}]}]
    rc, out = run_play(tmp_path, play)
    assert rc != 0 and "units: '--all' is not a systemd unit name" in out, out
    assert unit.read_text() == "old\n", "nothing was written"
    # a unit name as systemd writes it: the file is written and the result names the units found running (a unit
    # that does not exist, or a machine without systemd: none)
    play[0]["tasks"] = [{"hpcobs_files": {"files": [entry], "units": ["hpcobs-test-no-such-unit.service"]},
                         "register": "r"},
                        {"ansible.builtin.assert": {"that": ["r.units_active_enabled == []", "r is changed"]}}]
    rc, out = run_play(tmp_path, play)
    assert rc == 0, out
    assert unit.read_text() == "new\n"


def binary(dest, data, mode="0755", src=None):
    item = {"dest": str(dest), "sha256": __import__("hashlib").sha256(data).hexdigest(), "owner": ME,
            "group": MY_GROUP, "mode": mode}
    if src:
        item["src"] = str(src)
    return item


def test_a_binary_that_differs_is_named_for_transfer_then_installed_from_what_was_sent(tmp_path):
    program, sent = tmp_path / "bin" / "node_exporter", tmp_path / "sent"
    sent.write_bytes(b"\x7fELF new")
    transfer = []
    assert MODULE.sync([], [], False, binaries=[binary(program, b"\x7fELF new")], transfer=transfer) == []
    assert transfer == [str(program)] and not program.exists(), "the first run only names what must be sent"
    assert MODULE.sync([], [], False, binaries=[binary(program, b"\x7fELF new", src=sent)]) == [str(program)]
    assert program.read_bytes() == b"\x7fELF new" and stat.S_IMODE(os.stat(program).st_mode) == 0o755
    transfer = []
    assert MODULE.sync([], [], False, binaries=[binary(program, b"\x7fELF new")], transfer=transfer) == []
    assert transfer == [], "a converged host sends nothing"
    os.chmod(program, 0o777)
    assert MODULE.sync([], [], False, binaries=[binary(program, b"\x7fELF new")], transfer=transfer) == [str(program)]
    assert transfer == [] and stat.S_IMODE(os.stat(program).st_mode) == 0o755, "a wrong mode is fixed in place"
    assert sorted(os.listdir(program.parent)) == ["node_exporter"], "no temporary file is left behind"


def test_a_binary_that_arrives_damaged_is_not_installed_and_the_old_one_stays(tmp_path):
    program, sent = tmp_path / "promtail", tmp_path / "sent"
    program.write_bytes(b"old")
    sent.write_bytes(b"truncated")
    with pytest.raises(MODULE.FilesError, match="the file received has sha256 .* not the .* expected"):
        MODULE.sync([], [], False, binaries=[binary(program, b"the real one", src=sent)])
    assert program.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["promtail", "sent"]


def test_a_binary_in_check_mode_or_behind_a_symlink_or_without_a_digest(tmp_path):
    program = tmp_path / "alloy"
    program.write_bytes(b"old")
    transfer = []
    assert MODULE.sync([], [], True, binaries=[binary(program, b"new")], transfer=transfer) == [str(program)]
    assert transfer == [] and program.read_bytes() == b"old"
    link = tmp_path / "link"
    link.symlink_to(program)
    with pytest.raises(MODULE.FilesError, match="exists and is not a regular file"):
        MODULE.sync([], [], False, binaries=[binary(link, b"new", src=program)])
    with pytest.raises(MODULE.FilesError, match="is not a sha256 digest"):
        MODULE.sync([], [], False, binaries=[dict(binary(program, b"x"), sha256="abc")])


def test_through_ansible_binaries_are_sent_only_when_they_differ(tmp_path):
    source = tmp_path / "cache" / "vmagent-prod"
    source.parent.mkdir()
    source.write_bytes(b"\x7fELF vmagent" * 1000)
    dest = tmp_path / "bin" / "vmagent"
    entry = binary(dest, source.read_bytes(), src=source)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{"hpcobs_files": {"binaries": [entry]},
                                                                     "register": "out"},
                                                                    {"debug": {"var": "out.transfer"}}]}]
    rc, out = run_play(tmp_path, play, "--check")
    assert rc == 0 and "changed=1" in out and not dest.exists(), out
    rc, out = run_play(tmp_path, play)
    assert rc == 0 and "changed=1" in out, out
    assert dest.read_bytes() == source.read_bytes()
    rc, out = run_play(tmp_path, play)
    assert rc == 0 and "changed=0" in out and 'out.transfer: []' in out, out
    source.write_bytes(b"altered after the unpack step")
    dest.unlink()
    rc, out = run_play(tmp_path, play)
    assert rc != 0 and "not the %s expected" % entry["sha256"] in out, out
    assert not dest.exists()
    rc, out = run_play(tmp_path, [dict(play[0], tasks=[{"hpcobs_files": {"binaries": [dict(entry, src="/nonexistent")]}}])])
    assert rc != 0 and "its source /nonexistent is not a file on the controller" in out, out


def test_the_binaries_of_an_unpacked_archive():
    archive = {"sources": {"vmagent": "/c/1/vmagent-prod", "vmauth": "/c/1/vmauth-prod"},
               "sha256": {"vmagent": "a" * 64, "vmauth": "b" * 64}}
    import hpcobs_bundle
    assert hpcobs_bundle.artifact_binaries(archive, "/usr/local/bin/", ["vmauth"]) == [
        {"dest": "/usr/local/bin/vmauth", "src": "/c/1/vmauth-prod", "sha256": "b" * 64, "owner": "root",
         "group": "root", "mode": "0755"}]
    assert [item["dest"] for item in hpcobs_bundle.artifact_binaries(archive, "/opt/bin", [])] == [
        "/opt/bin/vmagent", "/opt/bin/vmauth"]
    with pytest.raises(hpcobs_bundle.AnsibleFilterError, match="names vmalert, which the archive does not have"):
        hpcobs_bundle.artifact_binaries(archive, "/usr/local/bin", ["vmalert"])


def test_an_artifact_is_pending_until_verified_for_the_hosts_architecture():
    import hpcobs_bundle
    pending = hpcobs_bundle.artifact_pending
    unpacked = {"artifact_unpacked": {"node_exporter": ["amd64"], "vmutils": ["amd64", "arm64"]}}
    assert not pending("node_exporter", unpacked, {"architecture": "x86_64"})
    assert pending("node_exporter", unpacked, {"architecture": "aarch64"})
    assert not pending("vmutils", unpacked, {"architecture": "aarch64"})
    assert pending("promtail", unpacked, {"architecture": "x86_64"})
    # nothing verified yet in this run, or facts not gathered (the verification then refuses the host)
    assert pending("node_exporter", {}, {"architecture": "x86_64"})
    assert pending("node_exporter", {"artifact_unpacked": None}, {"architecture": "x86_64"})
    assert pending("node_exporter", unpacked, {})
    assert pending("node_exporter", {"artifact_unpacked": {"node_exporter": ["unknown"]}}, {"architecture": "ppc64le"})


class FakeAccounts:
    """pwd/grp lookups over a dict, for account_commands: no account of the machine running the tests is touched."""

    def __init__(self, users=None, groups=None):
        self.users, self.groups = users or {}, groups or {}

    def user(self, name):
        from types import SimpleNamespace
        gid, home, shell, gecos = self.users[name]
        return SimpleNamespace(pw_gid=gid, pw_dir=home, pw_shell=shell, pw_gecos=gecos)

    def group(self, name):
        from types import SimpleNamespace
        return SimpleNamespace(gr_gid=self.groups[name])


ACCOUNT = {"user": "node_exporter", "group": "node_exporter", "home": "/nonexistent", "shell": "/usr/sbin/nologin",
           "comment": "node_exporter (hpcobs)"}


def test_a_missing_account_is_made_as_a_system_group_and_user():
    fake = FakeAccounts()
    assert MODULE.account_commands(ACCOUNT, fake.user, fake.group) == [
        ["groupadd", "--system", "node_exporter"],
        ["useradd", "--system", "--gid", "node_exporter", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", "--comment", "node_exporter (hpcobs)", "node_exporter"]]


def test_an_account_as_asked_costs_no_command_and_one_that_differs_gets_only_its_differences():
    fake = FakeAccounts({"node_exporter": (990, "/nonexistent", "/usr/sbin/nologin", "node_exporter (hpcobs)")},
                        {"node_exporter": 990})
    assert MODULE.account_commands(ACCOUNT, fake.user, fake.group) == []
    fake.users["node_exporter"] = (100, "/nonexistent", "/bin/bash", "node_exporter (hpcobs)")
    assert MODULE.account_commands(ACCOUNT, fake.user, fake.group) == [
        ["usermod", "--gid", "node_exporter", "--shell", "/usr/sbin/nologin", "node_exporter"]]
    del fake.groups["node_exporter"]
    assert MODULE.account_commands(dict(ACCOUNT, home="/var/lib/x"), fake.user, fake.group) == [
        ["groupadd", "--system", "node_exporter"],
        ["usermod", "--gid", "node_exporter", "--home", "/var/lib/x", "--shell", "/usr/sbin/nologin",
         "node_exporter"]]


@pytest.mark.parametrize("change, message", [
    ({"user": "Root"}, "is not a lowercase system account name"),
    ({"group": "-o"}, "is not a lowercase system account name"),
    ({"user": "a b"}, "is not a lowercase system account name"),
    ({"home": "relative"}, "is not an absolute path"),
    ({"comment": "x:y"}, "may not hold ':'"),
    ({"comment": "x\ny"}, "may not hold ':'"),
])
def test_an_account_that_would_corrupt_passwd_or_reach_an_option_is_refused(change, message):
    fake = FakeAccounts()
    with pytest.raises(MODULE.FilesError, match=message):
        MODULE.account_commands(dict(ACCOUNT, **change), fake.user, fake.group)


def test_sync_account_runs_the_commands_in_order_and_says_what_changed_but_runs_nothing_in_check_mode(monkeypatch):
    fake = FakeAccounts()
    monkeypatch.setattr(MODULE.pwd, "getpwnam", fake.user)
    monkeypatch.setattr(MODULE.grp, "getgrnam", fake.group)
    ran = []

    def run(argv, **_):
        from types import SimpleNamespace
        ran.append(argv[0])
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    assert MODULE.sync_account(ACCOUNT, check_mode=True, run=run) == (True, True)
    assert ran == [], "check mode runs nothing"
    assert MODULE.sync_account(ACCOUNT, check_mode=False, run=run) == (True, True)
    assert ran == ["groupadd", "useradd"]
    fake.groups["node_exporter"] = 990

    def refuse(argv, **_):
        from types import SimpleNamespace
        return SimpleNamespace(returncode=9, stdout="", stderr="useradd: UID 0 is not unique")

    with pytest.raises(MODULE.FilesError, match="account node_exporter: useradd exited 9: useradd: UID 0"):
        MODULE.sync_account(ACCOUNT, check_mode=False, run=refuse)


def test_the_action_plugin_refuses_an_account_without_its_group_or_with_an_unknown_key():
    with pytest.raises(ACTION.AnsibleActionFail, match="unknown keys uid"):
        ACTION.check_entries([dict(ACCOUNT, uid=0)], ACTION.ACCOUNT_KEYS, "user", "account")
    with pytest.raises(ACTION.AnsibleActionFail, match="has no user"):
        ACTION.check_entries([{"group": "x"}], ACTION.ACCOUNT_KEYS, "user", "account")


SHOW = """Id=node_exporter.service
ActiveState=active
UnitFileState=enabled

Id=ipmi_exporter-local.socket
ActiveState=active
UnitFileState=disabled

Id=smartctl_exporter.service
ActiveState=failed
UnitFileState=enabled

Id=dcgm_exporter.service
ActiveState=inactive
UnitFileState=
"""


def test_only_units_both_active_and_enabled_are_named():
    assert MODULE.parse_show(SHOW) == ["node_exporter.service"]
    assert MODULE.parse_show("") == []


def test_the_unit_state_is_read_with_one_systemctl_show_and_an_error_names_nothing(monkeypatch):
    from types import SimpleNamespace
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        assert kwargs["env"]["LC_ALL"] == "C"
        return SimpleNamespace(returncode=0, stdout=SHOW, stderr="")

    units = ["node_exporter.service", "ipmi_exporter-local.socket", "smartctl_exporter.service"]
    assert MODULE.units_active_enabled(units, run=run) == ["node_exporter.service"]
    assert calls == [["systemctl", "--no-pager", "show", "--property=Id,ActiveState,UnitFileState", "--"] + units]
    # a unit the output names but the task did not ask for is not taken
    assert MODULE.units_active_enabled(["ipmi_exporter-local.socket"], run=run) == []
    assert MODULE.units_active_enabled([], run=run) == [] and len(calls) == 2, "nothing asked, nothing run"

    def fails(argv, **_):
        return SimpleNamespace(returncode=1, stdout="", stderr="Failed to connect to bus")

    def missing(argv, **_):
        raise FileNotFoundError("systemctl")

    assert MODULE.units_active_enabled(["node_exporter.service"], run=fails) == []
    assert MODULE.units_active_enabled(["node_exporter.service"], run=missing) == []


@pytest.mark.parametrize("name", ["--all", "node_exporter", "/etc/systemd/system/x.service", "a b.service", ""])
def test_a_unit_name_that_is_an_option_or_a_path_is_refused(name):
    with pytest.raises(MODULE.FilesError, match="is not a systemd unit name"):
        MODULE.units_active_enabled([name], run=lambda *a, **k: pytest.fail("systemctl must not run"))


def test_the_module_is_a_jsonargs_module_that_imports_nothing_from_ansible(tmp_path):
    """Ansible sends it as JSONARGS (its text with the arguments in it, piped to Python), not as an AnsiballZ
    payload: it must keep the marker and no module_utils import. Run as Ansible runs it, it imports no Ansible
    module, reads check mode and diff from the arguments and answers in JSON."""
    source = jsonargs_module(os.path.join(ROOT, "roles/service/library/hpcobs_files.py"))
    dest = tmp_path / "a" / "f.conf"
    args = {"directories": [{"path": str(tmp_path / "a"), "owner": ME, "group": MY_GROUP, "mode": "0750"}],
            "files": [dict(entry(dest, b"new\n"), diff=True)], "absent": [], "binaries": [], "units": [],
            "_ansible_check_mode": True, "_ansible_diff": True}
    (tmp_path / "a").mkdir()
    dest.write_bytes(b"old\n")
    rc, answer, stderr = run_jsonargs_module(source, args, REPORT_ANSIBLE_IMPORTS)
    assert rc == 0, stderr
    assert stderr == b"[]", "no Ansible module is imported"
    assert answer["changed"] and answer["changed_paths"] == [str(tmp_path / "a"), str(dest)]
    assert answer["diff"][0]["before"] == "old\n" and answer["diff"][0]["after"] == "new\n"
    assert dest.read_bytes() == b"old\n", "check mode wrote nothing"
    args["_ansible_check_mode"] = False
    args["files"][0]["mode"] = "rw"
    rc, answer, _ = run_jsonargs_module(source, args)
    assert rc == 1 and answer["failed"] and "is not an octal mode" in answer["msg"], answer
    assert dest.read_bytes() == b"old\n"


def test_the_action_plugin_validates_the_arguments_and_fills_in_the_defaults():
    params = ACTION.module_arguments({"files": [{"dest": "/etc/x/a.conf", "content": "eA==", "diff": "yes"}],
                                      "directories": [{"path": "/etc/x"}], "units": ["x.service"]})
    assert params["files"][0] == {"dest": "/etc/x/a.conf", "content": "eA==", "owner": "root", "group": "root",
                                  "mode": "0644", "validate": None, "diff": True}
    assert params["directories"][0] == {"path": "/etc/x", "owner": "root", "group": "root", "mode": "0755"}
    assert params["absent"] == [] and params["binaries"] == [] and params["account"] is None
    account = ACTION.module_arguments({"account": {"user": "x", "group": "x"}})["account"]
    assert account == {"user": "x", "group": "x", "home": "/nonexistent", "shell": "/usr/sbin/nologin",
                       "comment": ""}
    with pytest.raises(ACTION.AnsibleActionFail, match=r"hpcobs_files: .*diff"):
        ACTION.module_arguments({"files": [{"dest": "/a", "content": "", "diff": "perhaps"}]})
    with pytest.raises(ACTION.AnsibleActionFail, match=r"hpcobs_files: .*sha256"):
        ACTION.module_arguments({"binaries": [{"dest": "/usr/local/bin/x"}]})
    with pytest.raises(ACTION.AnsibleActionFail, match=r"files: 'etc/x' is not an absolute path"):
        ACTION.module_arguments({"files": [{"dest": "etc/x", "content": ""}]})
    with pytest.raises(ACTION.AnsibleActionFail, match=r"directories: '~/x' is not an absolute path"):
        ACTION.module_arguments({"directories": [{"path": "~/x"}]})
    with pytest.raises(ACTION.AnsibleActionFail, match=r"relabel: 'usr/local/bin/x' is not an absolute path"):
        ACTION.module_arguments({"relabel": ["usr/local/bin/x"]})
    assert ACTION.module_arguments({})["relabel"] == []


# restorecon -v's lines (policycoreutils 2.7 and later; -n prints "Would relabel" instead)
RESTORECON = ("Relabeled /usr/local/bin/node_exporter from unconfined_u:object_r:user_tmp_t:s0 to "
              "system_u:object_r:bin_t:s0\n"
              "Relabeled /var/lib/node_exporter/textfile from unconfined_u:object_r:var_lib_t:s0 to "
              "system_u:object_r:var_lib_t:s0\n")


def test_relabel_runs_restorecon_once_and_names_what_it_relabelled():
    from types import SimpleNamespace
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        assert kwargs["env"]["LC_ALL"] == "C"
        text = RESTORECON if "-n" not in argv else RESTORECON.replace("Relabeled ", "Would relabel ")
        return SimpleNamespace(returncode=0, stdout=text, stderr="")

    paths = ["/usr/local/bin/node_exporter", "/var/lib/node_exporter"]
    wanted = ["/usr/local/bin/node_exporter", "/var/lib/node_exporter/textfile"]
    assert MODULE.relabel(paths, check_mode=False, run=run) == wanted
    assert MODULE.relabel(paths, check_mode=True, run=run) == wanted
    assert calls == [["restorecon", "-R", "-v"] + paths, ["restorecon", "-R", "-v", "-n"] + paths]
    assert MODULE.relabel([], check_mode=False, run=run) == [] and len(calls) == 2, "nothing asked, nothing run"
    quiet = SimpleNamespace(returncode=0, stdout="", stderr="")
    assert MODULE.relabel(paths, check_mode=False, run=lambda *a, **k: quiet) == [], "labels already right"


def test_a_relabel_that_fails_or_is_not_absolute_fails_the_task():
    from types import SimpleNamespace

    def fails(argv, **_):
        return SimpleNamespace(returncode=255, stdout="", stderr="restorecon: lstat(/nonexistent) failed: No such file")

    with pytest.raises(MODULE.FilesError, match=r"restorecon failed \(exit 255\): .*No such file"):
        MODULE.relabel(["/nonexistent"], check_mode=False, run=fails)

    def missing(argv, **_):
        raise FileNotFoundError("restorecon")

    with pytest.raises(MODULE.FilesError, match="restorecon did not run"):
        MODULE.relabel(["/usr/local/bin/x"], check_mode=False, run=missing)
    with pytest.raises(MODULE.FilesError, match="is not an absolute path"):
        MODULE.relabel(["-F"], check_mode=False, run=lambda *a, **k: pytest.fail("restorecon must not run"))


def test_a_relabelled_path_changes_the_run_and_a_failing_restorecon_fails_it(tmp_path, monkeypatch):
    """The module as the unit task runs it: files right, a path relabelled -> changed, named in changed_paths and
    relabelled; restorecon failing -> failed with its message. restorecon is a test double on PATH (these test
    hosts have no SELinux)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    double = bin_dir / "restorecon"
    double.write_text("#!/bin/sh\necho \"$@\" > %s/argv\nprintf '%%s' \"$RESTORECON_OUT\"\nexit ${RESTORECON_RC:-0}\n"
                      % tmp_path)
    double.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    dest = tmp_path / "x.service"
    dest.write_bytes(b"[Unit]\n")
    params = {"files": [entry(dest, b"[Unit]\n", "0644")], "relabel": ["/usr/local/bin/node_exporter"]}
    monkeypatch.setenv("RESTORECON_OUT", RESTORECON.splitlines()[0] + "\n")
    result = MODULE.run(params)
    assert result["changed"] and result["changed_paths"] == ["/usr/local/bin/node_exporter"], result
    assert result["relabelled"] == ["/usr/local/bin/node_exporter"]
    assert (tmp_path / "argv").read_text() == "-R -v /usr/local/bin/node_exporter\n"
    result = MODULE.run(dict(params, _ansible_check_mode=True))
    assert (tmp_path / "argv").read_text() == "-R -v -n /usr/local/bin/node_exporter\n"
    monkeypatch.setenv("RESTORECON_OUT", "")
    result = MODULE.run(params)
    assert not result["changed"] and result["relabelled"] == [], result
    monkeypatch.setenv("RESTORECON_RC", "1")
    result = MODULE.run(params)
    assert result["failed"] and "restorecon failed (exit 1)" in result["msg"], result
    assert MODULE.run(dict(params, relabel=[]))["changed"] is False, "no relabel asked, restorecon not run"


def test_a_unit_that_should_not_be_there_is_stopped_disabled_and_removed_then_systemd_reloaded(tmp_path):
    from types import SimpleNamespace
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        assert kwargs["env"]["LC_ALL"] == "C"
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    (tmp_path / "ipmi_exporter-front.service").write_text("[Service]\n")
    wanted = [str(tmp_path / "ipmi_exporter-front.service")]
    units = ["ipmi_exporter-front.service", "loki-front.service"]
    assert MODULE.remove_units(units, check_mode=True, run=run, unit_dir=str(tmp_path)) == wanted
    assert calls == [] and (tmp_path / "ipmi_exporter-front.service").exists(), "check mode only names it"
    assert MODULE.remove_units(units, check_mode=False, run=run, unit_dir=str(tmp_path)) == wanted
    assert calls == [["systemctl", "disable", "--now", "--", "ipmi_exporter-front.service"],
                     ["systemctl", "daemon-reload"]], "only the unit that is there, one reload"
    assert not (tmp_path / "ipmi_exporter-front.service").exists()
    assert MODULE.remove_units(units, check_mode=False, run=run, unit_dir=str(tmp_path)) == []
    assert len(calls) == 2, "nothing there, nothing run"


def test_a_unit_removal_that_fails_leaves_the_file_and_a_bad_name_changes_nothing(tmp_path):
    from types import SimpleNamespace
    unit = tmp_path / "x-front.service"
    unit.write_text("[Service]\n")

    def fails(argv, **_):
        return SimpleNamespace(returncode=1, stdout="", stderr="Failed to connect to bus")

    with pytest.raises(MODULE.FilesError, match=r"systemctl disable --now -- x-front.service failed \(exit 1\)"):
        MODULE.remove_units(["x-front.service"], check_mode=False, run=fails, unit_dir=str(tmp_path))
    assert unit.exists()
    dest = tmp_path / "a.conf"
    result = MODULE.run({"files": [entry(dest, b"x\n")], "remove_units": ["--all"]})
    assert result["failed"] and "remove_units: '--all' is not a systemd unit name" in result["msg"], result
    assert not dest.exists(), "refused before anything changed"
    assert ACTION.module_arguments({})["remove_units"] == []
