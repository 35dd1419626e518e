"""roles/service's hpcobs_read: the read-only query module the roles run on every host and run (the packages query,
the groups of a running service, the hooks' self-test), sent as a JSONARGS module."""
import importlib.util
import pytest

from tooling import REPO, REPORT_ANSIBLE_IMPORTS, jsonargs_module, run_jsonargs_module

PATH = REPO / "roles" / "service" / "library" / "hpcobs_read.py"
_spec = importlib.util.spec_from_file_location("hpcobs_read", PATH)
MODULE = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MODULE)


def test_run_as_ansible_runs_it_it_imports_nothing_from_ansible_and_returns_what_the_command_printed():
    source = jsonargs_module(PATH)
    argv = ["/bin/sh", "-c", 'printf "a b\\nc\\n\\n"; echo warn >&2; exit 3']
    rc, answer, stderr = run_jsonargs_module(source, {"argv": argv, "_ansible_check_mode": True}, REPORT_ANSIBLE_IMPORTS)
    assert rc == 0 and stderr == b"[]", stderr
    assert answer == {"changed": False, "cmd": argv, "rc": 3, "stdout": "a b\nc", "stderr": "warn",
                      "stdout_lines": ["a b", "c"], "stderr_lines": ["warn"]}, "runs in check mode, rc not judged"


@pytest.mark.parametrize("raw,message", [
    ({}, "argv must be a non-empty list of strings"),
    ({"argv": "dpkg-query --show"}, "argv must be a non-empty list of strings"),
    ({"argv": []}, "argv must be a non-empty list of strings"),
    ({"argv": ["", "x"]}, "argv must be a non-empty list of strings"),
    ({"argv": ["true", 3]}, "argv must be a non-empty list of strings"),
    ({"argv": ["true"], "chdir": "/tmp"}, "Unsupported parameters for (hpcobs_read) module: chdir"),
    ({"argv": ["true"], "timeout": "soon"}, "timeout must be a number of seconds"),
    ({"argv": ["true"], "timeout": 0}, "timeout must be a number of seconds above 0"),
])
def test_wrong_arguments_fail_before_anything_runs(raw, message):
    rc, answer, _ = run_jsonargs_module(jsonargs_module(PATH), raw)
    assert rc == 1 and answer["failed"] and message in answer["msg"], answer
    assert "rc" not in answer, "nothing ran"


def test_a_command_that_cannot_start_fails_with_rc_127_and_one_that_hangs_is_killed(tmp_path):
    answer = MODULE.read([str(tmp_path / "missing")], 10)
    assert answer["failed"] and answer["rc"] == 127 and "could not be started" in answer["msg"], answer
    assert answer["stdout_lines"] == [] and answer["changed"] is False
    answer = MODULE.read(["sleep", "30"], 1)
    assert answer["failed"] and answer["rc"] == -9 and "did not end within 1 s" in answer["msg"], answer


def test_output_that_is_not_utf8_is_returned_not_a_crash():
    answer = MODULE.read(["printf", "\\377ok\\n"], 10)
    assert answer["rc"] == 0 and answer["stdout"] == "\ufffdok", answer


def test_the_groups_query_of_holds_group_passes_its_values_as_parameters_not_as_script_text(tmp_path):
    """roles/service tasks_from holds_group: the unit and group names reach bash as $1 and $2 (a hostile value
    stays a value)."""
    import yaml
    tasks = yaml.safe_load((REPO / "roles" / "service" / "tasks" / "holds_group.yml").read_text())
    [argv] = [task["hpcobs_read"]["argv"] for task in tasks if "hpcobs_read" in task]
    assert argv[:2] == ["/bin/bash", "-c"] and "{{" not in argv[2], "no template inside the script"
    assert argv[4:] == ["{{ service_unit }}", "{{ service_required_group }}"]
    marker = tmp_path / "pwned"
    # systemctl stands in as a shell function answering the shell's own pid (a process whose groups root's are)
    script = "systemctl() { echo $$; }; " + argv[2]
    answer = MODULE.read(["/bin/bash", "-c", script, argv[3], "x.service; touch %s" % marker, "root"], 10)
    assert answer["rc"] == 0 and answer["stdout_lines"][-1] == "0", answer
    assert not marker.exists()
