"""The staged rollout's end-of-run summary (playbooks/callback_plugins/hpcobs_rollout.py) and the rollout keywords.

Toy plays on local-connection inventory names stand for GPU nodes and a controller (nothing is installed); they use
the same serial / max_fail_percentage expressions as playbooks/gpu_nodes.yml, read from that file.
"""
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def play_keywords(name):
    """The first play of a playbook (an import_playbook before it, such as management.yml's PKI, is skipped)."""
    with open(os.path.join(ROOT, "playbooks", name), encoding="utf-8") as handle:
        return [entry for entry in yaml.safe_load(handle) if "hosts" in entry][0]


def test_the_site_plays_are_staged():
    gpu = play_keywords("gpu_nodes.yml")
    assert gpu["serial"] == ("{{ hpcobs_gpu_serial | default([1, [(groups['gpu_nodes'] | default([]) | length * 0.1)"
                             " | round(0, 'ceil') | int, 25] | max]) }}")
    assert gpu["max_fail_percentage"] == "{{ hpcobs_gpu_max_fail_percentage | default(10) }}"
    assert play_keywords("management.yml")["serial"] == "{{ hpcobs_management_serial | default(1) }}"


@pytest.fixture
def toy(tmp_path):
    gpu = play_keywords("gpu_nodes.yml")
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"gpu_nodes": {"hosts": {"gpu%02d" % i: {} for i in range(1, 11)}},
                     "slurm_controllers": {"hosts": {"ctl01": {}}}}}}))
    (tmp_path / "site.yml").write_text(yaml.safe_dump([
        {"name": "GPU node telemetry", "hosts": "gpu_nodes", "gather_facts": False, "serial": gpu["serial"],
         "max_fail_percentage": gpu["max_fail_percentage"],
         "tasks": [{"name": "Deploy", "ansible.builtin.fail": {"msg": "node lost"},
                    "when": "inventory_hostname in bad | default([])"}]},
        {"name": "Slurm job attribution on the controllers", "hosts": "slurm_controllers", "gather_facts": False,
         "tasks": [{"name": "Configure", "ansible.builtin.debug": {"msg": "ok"}}]},
    ]))

    def run(*extra):
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0")
        proc = subprocess.run([PLAYBOOK_BIN, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "site.yml")]
                              + list(extra), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        summary = proc.stderr[proc.stderr.index("NOT DEPLOYED"):] if "NOT DEPLOYED" in proc.stderr else ""
        assert "NOT DEPLOYED" not in proc.stdout  # stdout stays the stdout callback's
        return proc, summary
    return run


def test_a_failed_node_is_named_and_the_others_finish(toy):
    # batches: gpu01 (canary), then 3 nodes at a time; one failure in three stays under 40%
    proc, summary = toy("-e", '{"bad": ["gpu05"], "hpcobs_gpu_serial": [1, "30%"], "hpcobs_gpu_max_fail_percentage": 40}')
    assert proc.returncode == 2
    assert summary.startswith("NOT DEPLOYED (1 host)"), proc.stdout[-2000:]
    assert "gpu05: failed in task [Deploy]: node lost" in summary
    assert re.search(r"^ctl01\s+: ok=1 ", proc.stdout, re.M)  # the run went on to the controllers


def test_a_failed_canary_stops_the_rollout_and_every_node_not_reached_is_named(toy):
    proc, summary = toy("-e", '{"bad": ["gpu01"]}')
    assert proc.returncode == 2
    assert "gpu01: failed in task [Deploy]" in summary
    for host in ["gpu%02d" % i for i in range(2, 11)] + ["ctl01"]:
        assert re.search(r"^  %s: never reached by play \[" % host, summary, re.M), summary
    assert "PLAY [Slurm job attribution on the controllers]" not in proc.stdout


def test_a_batch_beyond_the_threshold_stops_the_rollout(toy):
    # batches: gpu01 (canary), then 2 at a time: both failing is 100% > 40%; one failing is 50%, not above 50%
    proc, summary = toy("-e", '{"bad": ["gpu02", "gpu03"], "hpcobs_gpu_serial": [1, 2], '
                              '"hpcobs_gpu_max_fail_percentage": 40}')
    assert proc.returncode == 2
    assert "gpu02: failed" in summary and "gpu03: failed" in summary
    assert re.search(r"^  gpu04: never reached by play \[GPU node telemetry\]", summary, re.M), summary
    proc, summary = toy("-e", '{"bad": ["gpu02"], "hpcobs_gpu_serial": [1, 2], "hpcobs_gpu_max_fail_percentage": 50}')
    assert summary.startswith("NOT DEPLOYED (1 host)") and "gpu02: failed" in summary


def test_nothing_is_printed_when_every_host_is_deployed(toy):
    proc, summary = toy()
    assert proc.returncode == 0 and summary == ""


def test_with_the_defaults_a_small_cluster_runs_a_canary_then_the_rest_at_once(toy):
    """10 nodes: the canary, then one batch of 9 (10% of the nodes, but at least 25 a batch)."""
    proc, summary = toy()
    assert proc.stdout.count("PLAY [GPU node telemetry]") == 2, proc.stdout[-2000:]


def test_with_the_defaults_a_lone_failed_node_in_a_small_cluster_stops_its_batch_and_names_it(toy):
    """One failed node of a batch of 9 is 11%, beyond 10%: Ansible stops the whole batch at that task (documented);
    the summary names each node it stopped, which did not fail itself, and the controllers never reached."""
    proc, summary = toy("-e", '{"bad": ["gpu05"]}')
    assert proc.returncode == 2
    assert "gpu05: failed in task [Deploy]" in summary
    assert re.search(r"^  gpu06: stopped in task \[Deploy\] of play \[GPU node telemetry\]: its batch's failed "
                     r"share went beyond max_fail_percentage", summary, re.M), summary
    assert "gpu01" not in summary  # the canary finished before
    assert re.search(r"^  ctl01: never reached by play \[", summary, re.M), summary


@pytest.fixture
def gate(tmp_path):
    """The controllers' gate task of playbooks/slurm.yml, run after a toy hooks play on local-connection nodes."""
    with open(os.path.join(ROOT, "playbooks", "slurm.yml"), encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    hooks_play = [p for p in plays if p["name"] == "Slurm job attribution hooks on the GPU nodes"][0]
    controllers = [p for p in plays if p["name"] == "Slurm job attribution on the controllers"][0]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"gpu_nodes": {"hosts": {"gpu01": {}, "gpu02": {}, "gpu03": {}}},
                     "slurm_controllers": {"hosts": {"ctl01": {}}}}}}))
    (tmp_path / "slurm.yml").write_text(yaml.safe_dump([
        {"name": hooks_play["name"], "hosts": "gpu_nodes", "gather_facts": False,
         "pre_tasks": hooks_play["pre_tasks"],
         "tasks": [{"name": "Install the hooks", "ansible.builtin.fail": {"msg": "node lost"},
                    "when": "inventory_hostname in bad | default([])"}],
         "post_tasks": hooks_play["post_tasks"]},
        {"name": controllers["name"], "hosts": "slurm_controllers", "gather_facts": False,
         "tasks": controllers["pre_tasks"] + [{"name": "Write Prolog=", "ansible.builtin.debug": {"msg": "prolog-applied"}}]},
    ]))

    def run(*extra):
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0")
        return subprocess.run([PLAYBOOK_BIN, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "slurm.yml")]
                              + list(extra), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    return run


def test_the_controllers_get_prolog_only_when_every_node_has_the_hooks(gate):
    proc = gate()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "prolog-applied" in proc.stdout
    proc = gate("-e", '{"bad": ["gpu02"]}')
    assert proc.returncode == 2
    assert "Prolog=/Epilog= not written to slurm.conf: the hooks are not in place on gpu02" in proc.stdout
    flat = " ".join((proc.stdout + proc.stderr).split())  # the yaml result format wraps long messages
    assert "(e.g. --limit gpu02,ctl01)" in flat, flat[flat.find("Fix them") - 50:flat.find("Fix them") + 120]
    assert "prolog-applied" not in proc.stdout
    assert "ctl01: failed in task [Wait for the hooks on every GPU node of this run" in proc.stderr
    proc = gate("-e", '{"bad": ["gpu02"], "hpcobs_slurm_hooks_require_every_node": false}')
    assert "prolog-applied" in proc.stdout


def test_nodes_outside_the_limit_do_not_hold_the_controllers_back(gate):
    proc = gate("--limit", "gpu01,ctl01")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "prolog-applied" in proc.stdout


def test_a_failure_a_block_rescues_is_not_reported(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n      ansible_connection: local\n"
                                        "      ansible_python_interpreter: %s\n" % sys.executable)
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"block": [{"name": "Try", "ansible.builtin.fail": {"msg": "expected"}}],
         "rescue": [{"name": "Recover", "ansible.builtin.debug": {"msg": "recovered"}}]}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([PLAYBOOK_BIN, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "recovered" in proc.stdout
    assert "NOT DEPLOYED" not in proc.stdout + proc.stderr


def test_a_json_stdout_stays_parseable_with_the_summary(tmp_path):
    """Tests and tools read the json stdout callback's output: the summary goes to stderr."""
    import json
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n      ansible_connection: local\n"
                                        "      ansible_python_interpreter: %s\n" % sys.executable)
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Fail", "ansible.builtin.fail": {"msg": "boom"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    proc = subprocess.run([PLAYBOOK_BIN, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["stats"]["gpu01"]["failures"] == 1
    assert "gpu01: failed in task [Fail]: boom" in proc.stderr


def test_the_slurm_controllers_come_last_in_the_site():
    """A controller refusing Prolog= is a whole failed batch (one host), which ends an Ansible run: nothing may follow."""
    with open(os.path.join(ROOT, "playbooks", "site.yml"), encoding="utf-8") as handle:
        imports = [entry["ansible.builtin.import_playbook"] for entry in yaml.safe_load(handle)]
    assert imports == ["preflight.yml", "pki.yml", "gpu_nodes.yml", "management.yml", "slurm.yml"]
    with open(os.path.join(ROOT, "playbooks", "slurm.yml"), encoding="utf-8") as handle:
        assert yaml.safe_load(handle)[-1]["name"] == "Slurm job attribution on the controllers"
