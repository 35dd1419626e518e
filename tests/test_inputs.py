"""Settings typed as the roles declare them, and preflight checks that run whatever tags are asked.

The filters (playbooks/filter_plugins/hpcobs_inputs.py) are tested directly; then playbooks/site.yml is listed with a
phase tag, and playbooks/preflight.yml is run for real on localhost with typed and untyped -e values.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("hpcobs_inputs", os.path.join(ROOT, "playbooks", "filter_plugins",
                                                                             "hpcobs_inputs.py"))
inputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inputs)
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


@pytest.fixture(scope="module")
def types():
    return inputs.roles_argument_types(os.path.join(ROOT, "roles"))


def test_types_come_from_every_role(types):
    assert types["node_exporter_ready_timeout"] == ("int", "node_exporter")
    assert types["artifact_bundle_allow_unsigned"] == ("bool", "artifact")
    assert types["node_exporter_collectors_enabled"][0] == "list"
    assert "node_exporter_listen_address" not in types  # strings are not checked here


@pytest.mark.parametrize("name,value,message", [
    ("node_exporter_ready_timeout", "30", "node_exporter_ready_timeout is the string \"30\", but roles/node_exporter "
     "declares it int; from the command line pass it typed, as JSON: -e '{\"node_exporter_ready_timeout\": 30}'"),
    ("artifact_bundle_allow_unsigned", "no", "-e '{\"artifact_bundle_allow_unsigned\": false}'"),
    ("node_exporter_collectors_enabled", '["systemd"]', "-e '{\"node_exporter_collectors_enabled\": [\"systemd\"]}'"),
    ("node_exporter_ready_timeout", True, "node_exporter_ready_timeout is a bool: true, but roles/node_exporter "
     "declares it int"),
])
def test_mistyped_values_are_named_with_their_typed_form(types, name, value, message):
    problems = inputs.mistyped({name: value}, types)
    assert len(problems) == 1 and message in problems[0]


def test_a_string_with_no_typed_reading_gets_no_wrong_hint(types):
    problems = inputs.mistyped({"node_exporter_ready_timeout": "soon"}, types)
    assert problems == ['node_exporter_ready_timeout is the string "soon", but roles/node_exporter declares it int']


def test_well_typed_and_absent_values_pass(types):
    assert inputs.mistyped({"node_exporter_ready_timeout": 30, "artifact_bundle_allow_unsigned": False,
                            "node_exporter_collectors_enabled": [], "grafana_http_port": None,
                            "not_a_role_variable": "x"}, types) == []


def run(args, **env):
    environment = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                       ANSIBLE_FORCE_COLOR="0", **env)
    return subprocess.run([PLAYBOOK_BIN] + args, cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=600)


def test_a_phase_tag_still_runs_every_preflight_check():
    proc = run(["-i", "inventories/example", "playbooks/site.yml", "--list-tasks", "--tags", "alertmanager:configure"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    listing = proc.stdout
    for task in ("Check the settings have the types the roles declare", "Keep the management host off the GPU nodes",
                 "Verify each component in the bundle", "alertmanager : Check the service settings",
                 "node_exporter : Check the settings", "alertmanager : Write alertmanager.yml"):
        assert task in listing, task
    # the install phase was not asked for: alertmanager's account task (listed when it is) is not there
    account = "service : Create the account and the directories of {{ service_name }}\tTAGS: [alertmanager, alertmanager:install]"
    assert account not in listing
    install = run(["-i", "inventories/example", "playbooks/site.yml", "--list-tasks", "--tags", "alertmanager:install"])
    assert account in install.stdout, install.stdout[-2000:]


@pytest.fixture
def local_inventory(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                         "      ansible_python_interpreter: %s\n" % sys.executable)
    return str(inventory)


def test_an_untyped_extra_var_is_refused_before_anything_else(local_inventory, tmp_path):
    proc = run(["-i", local_inventory, "playbooks/preflight.yml", "-e", "node_exporter_ready_timeout=30",
                "-e", "hpcobs_bundle_dir=%s" % (tmp_path / "nowhere")])
    assert proc.returncode != 0
    assert "node_exporter_ready_timeout is the string \"30\"" in proc.stdout
    assert "-e '{\"node_exporter_ready_timeout\": 30}'" in proc.stdout
    assert "TypeError" not in proc.stdout and "not supported between" not in proc.stdout


def test_the_typed_form_passes_the_type_check(local_inventory, tmp_path):
    proc = run(["-i", local_inventory, "playbooks/preflight.yml", "-e", '{"node_exporter_ready_timeout": 30}',
                "-e", "hpcobs_bundle_dir=%s" % (tmp_path / "nowhere")])
    # localhost is in no group: the inventory checks pass and no bundle is needed
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Check the settings have the types the roles declare" in proc.stdout


def test_a_gpu_sample_interval_set_for_one_group_only_is_refused(tmp_path):
    """The GPU nodes collect and the management hosts scrape at hpcobs_gpu_sample_interval: set in group_vars of
    gpu_nodes only, the two would disagree."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {"children": {
        "gpu_nodes": {"hosts": {"gpu01": local, "gpu02": local}, "vars": {"hpcobs_gpu_sample_interval": "15s"}},
        "management": {"hosts": {"mgmt01": local}}}}}))
    proc = run(["-i", str(inventory), "playbooks/preflight.yml",
                "-e", "hpcobs_bundle_dir=%s" % (tmp_path / "nowhere")])
    assert proc.returncode != 0
    output = " ".join(proc.stdout.split())
    assert "TASK [Check the GPU sample interval is one duration on every host]" in output
    assert ("hpcobs_gpu_sample_interval differs between hosts (15s on gpu01, gpu02; 30s on mgmt01): the GPU nodes "
            "collect and the management hosts scrape at it, so set it once for all hosts (group_vars/all). Nothing "
            "was changed.") in output
    # the same value everywhere passes that check
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("hpcobs_gpu_sample_interval: 1m\n")
    inventory.write_text(inventory.read_text().replace('"15s"', '"60s"'))
    proc = run(["-i", str(inventory), "playbooks/preflight.yml",
                "-e", "hpcobs_bundle_dir=%s" % (tmp_path / "nowhere")])
    assert "differs between hosts" not in proc.stdout
    assert "TASK [Check the GPU sample interval is one duration on every host]" in proc.stdout


@pytest.fixture(scope="module")
def choices():
    return inputs.roles_argument_choices(os.path.join(ROOT, "roles"))


def test_choices_come_from_every_role(choices):
    assert choices["promtail_log_level"] == (["debug", "info", "warn", "error"], "promtail")
    assert choices["dcgm_exporter_install_method"] == (["package", "binary", "none"], "dcgm_exporter")
    assert choices["smartctl_exporter_powermode_check"][1] == "smartctl_exporter"
    assert "promtail_http_listen_port" not in choices


@pytest.mark.parametrize("name,value,message", [
    ("promtail_log_level", "verbose", 'promtail_log_level is "verbose", but roles/promtail allows only "debug", '
     '"info", "warn", "error"'),
    ("dcgm_exporter_install_method", "pip", 'dcgm_exporter_install_method is "pip", but roles/dcgm_exporter allows '
     'only "package", "binary", "none"'),
    ("grafana_install_method", ["tarball"], 'grafana_install_method is ["tarball"], but roles/grafana allows only'),
    ("alloy_log_level", True, 'alloy_log_level is true, but roles/alloy allows only'),
])
def test_values_outside_the_choices_are_named(types, choices, name, value, message):
    problems = inputs.mistyped({name: value}, types, choices)
    assert len(problems) == 1 and message in problems[0], problems


def test_values_among_the_choices_pass(types, choices):
    assert inputs.mistyped({"promtail_log_level": "warn", "dcgm_exporter_install_method": "none",
                            "lab_gpu_simulator_emulate": 4.8, "loki_log_level": None,
                            "smartctl_exporter_powermode_check": "__hpcobs_unset__"}, types, choices) == []


def test_choices_from_spec_text():
    text = ("argument_specs:\n  main:\n    options:\n      a: {type: str, choices: [x, y]}\n"
            "      b: {type: int, choices: [1, 2]}\n      c: {type: str}\n")
    choices = inputs.argument_choices([("r", text)])
    assert choices == {"a": (["x", "y"], "r"), "b": ([1, 2], "r")}
    types = inputs.argument_types([("r", text)])
    assert inputs.mistyped({"b": 3}, types, choices) == ["b is 3, but roles/r allows only 1, 2"]
    # a value of the wrong type is reported as such, not as a wrong choice
    assert "declares it int" in inputs.mistyped({"b": "two"}, types, choices)[0]


def test_a_value_outside_the_choices_is_refused_before_anything_else(local_inventory, tmp_path):
    proc = run(["-i", local_inventory, "playbooks/preflight.yml", "-e", "promtail_log_level=verbose",
                "-e", "hpcobs_bundle_dir=%s" % (tmp_path / "nowhere")])
    assert proc.returncode != 0
    assert 'promtail_log_level is "verbose", but roles/promtail allows only "debug", "info", "warn", "error"' \
        in proc.stdout
    assert "Nothing was changed." in proc.stdout


# The preflight asserts that repeated these choices are gone: a role used without playbooks/preflight.yml refuses
# the value through its own argument validation, the first task of the role, before its preflight runs.
CHOICE_CASES = {
    "promtail": ("promtail_log_level", "verbose"),
    "alloy": ("alloy_log_level", "trace"),
    "loki": ("loki_log_level", "fatal"),
    "dcgm_exporter": ("dcgm_exporter_install_method", "pip"),
    "grafana": ("grafana_install_method", "docker"),
    "smartctl_exporter": ("smartctl_exporter_powermode_check", "always"),
}
CHOICE_PLAY = """
- name: Roles used alone with a value outside their choices
  hosts: localhost
  gather_facts: false
  tasks:
{cases}
"""
CHOICE_CASE = """
    - name: Case {role}
      block:
        - name: Run {role}
          ansible.builtin.include_role:
            name: {role}
          vars:
            {name}: {value}
        - name: Record a pass
          ansible.builtin.set_fact:
            _seen: "{{{{ _seen | default({{}}) | combine({{'{role}': 'accepted'}}) }}}}"
      rescue:
        - name: Record the refusal
          ansible.builtin.set_fact:
            _seen: "{{{{ _seen | default({{}}) | combine({{'{role}': ansible_failed_result.msg}}) }}}}"
"""


def test_a_role_used_alone_refuses_a_value_outside_its_choices(local_inventory, tmp_path):
    cases = "".join(CHOICE_CASE.format(role=role, name=name, value=value)
                    for role, (name, value) in sorted(CHOICE_CASES.items()))
    play = tmp_path / "play.yml"
    play.write_text(CHOICE_PLAY.format(cases=cases) + """
    - name: Write what each case gave
      ansible.builtin.copy:
        content: "{{ _seen | to_json }}"
        dest: %s
        mode: "0644"
""" % (tmp_path / "seen.json"))
    proc = run(["-i", local_inventory, str(play)], ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert sorted(seen) == sorted(CHOICE_CASES)
    for role, (name, value) in CHOICE_CASES.items():
        message = " ".join(seen[role].split())
        assert message.startswith("Validation of arguments failed"), (role, message)
        assert "value of %s must be one of" % name in message and "got: %s" % value in message, (role, message)
    # no task of any role ran before the refusal: the first task is the argument validation
    assert "Check the operating system is supported" not in proc.stdout
