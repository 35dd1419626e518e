"""Every task of a role that writes a file which can hold a secret has `diff: false` (a --diff run would print the
secret) and a mode that others cannot read. The list below names each such file and why it can hold one; a file
task with no_log (it handles a secret) must be in it too, so a new one cannot be left out silently."""
import glob
import os
import re
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("ansible.builtin.template", "ansible.builtin.copy", "template", "copy", "hpcobs_files")

# (role, task name) -> why the file can hold a secret
SECRET_FILES = {
    ("alertmanager", "Write the receiver secrets"): "webhook URLs, SMTP passwords, API keys (alertmanager_secrets)",
    ("alertmanager", "Write alertmanager.yml (checked by amtool check-config first)"):
        "inline secrets when alertmanager_allow_inline_secrets is set",
    ("alloy", "Write the Loki password file"): "the password of the proxy in front of Loki",
    ("alloy", "Write the Alloy configuration"): "Loki client settings (credentials of a Loki front)",
    ("grafana", "Write the admin password given by the site"): "grafana_admin_password",
    ("grafana", "Generate an admin password unless there is one"): "the generated admin password",
    ("grafana", "Write the secret key given by the site"): "grafana_secret_key",
    ("grafana", "Generate a secret key unless there is one"): "the generated secret key",
    ("grafana", "Write grafana.ini"): "grafana_ini may set database, SMTP or OAuth passwords",
    ("grafana", "Provision the datasources"):
        "secureJsonData of grafana_datasources_extra (passwords, tokens); the role's own credentials are $__file{}",
    ("ipmi_exporter", "Write the ipmi_exporter configuration"): "BMC user names and passwords of the modules",
    ("loki", "Write the Loki configuration"):
        "object-store keys in loki_config_overrides; the ruler's Alertmanager password under hpcobs_security",
    ("promtail", "Write the Promtail configuration"): "basic-auth passwords of clients in promtail_config_overrides",
    ("victoriametrics", "Write the scrape configuration (checked by victoria-metrics -promscrape.config.dryRun first)"):
        "basic-auth passwords and bearer tokens of scrape jobs",
    ("victoriametrics", "Install the Slurm token for slurmctld's metrics"): "the Slurm JWT of the MetricsAuthUsers user",
    ("victoriametrics", "Install the remote-write secrets"):
        "the password or bearer token of each victoriametrics_remote_write URL",
    ("service", "Install the TLS files of {{ service_name }}"):
        "the host's TLS private key and the site PKI's generated credentials (tasks_from: tls)",
    ("service", "Write the web configuration of {{ service_name }}"):
        "the bcrypt hash of a generated credential (tasks_from: web_config)",
    ("service", "Install the TLS files and the web configuration of {{ service_name }}"):
        "the key, the credentials and the bcrypt hash of a credential (tasks_from: web_tls)",
    ("service", "Write the auth config of {{ service_name }}"):
        "the users' passwords of a vmauth front (tasks_from: vmauth_front: Loki's push and reader credentials)",
}


def file_tasks():
    """(role, path, task) of every template/copy task in roles/*/tasks and handlers, blocks included."""
    found = []

    def walk(role, path, tasks):
        for task in tasks or []:
            if not isinstance(task, dict):
                continue
            for key in ("block", "rescue", "always"):
                walk(role, path, task.get(key))
            if any(module in task for module in MODULES):
                found.append((role, path, task))
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))
                       + glob.glob(os.path.join(ROOT, "roles", "*", "handlers", "*.yml"))):
        with open(path, encoding="utf-8") as handle:
            walk(path.split(os.sep)[-3], path, yaml.safe_load(handle))
    return found


TASKS = file_tasks()


def args(task):
    return next(task[m] for m in MODULES if m in task)


def test_the_scan_finds_the_file_tasks():
    assert len(TASKS) > 40


@pytest.mark.parametrize("role,name", sorted(SECRET_FILES))
def test_each_file_that_can_hold_a_secret_is_written_without_diff(role, name):
    matches = [task for r, _, task in TASKS if r == role and task.get("name") == name]
    assert len(matches) == 1, "roles/%s has no single task named %r: update SECRET_FILES" % (role, name)
    task = matches[0]
    assert task.get("diff") is False, "roles/%s %r writes a file that can hold %s: add diff: false" % (
        role, name, SECRET_FILES[(role, name)])
    mode = str(args(task).get("mode", ""))
    literal = [entry for entry in args(task).get("files", []) if isinstance(entry, dict)] \
        if isinstance(args(task).get("files"), list) else []
    if literal:  # a hpcobs_files task with its entries written out: the widest of their modes
        assert all(not entry.get("diff") for entry in literal), "roles/%s %r: a secret entry with diff" % (role, name)
        mode = max((str(entry.get("mode", "")) for entry in literal), key=lambda m: int(m, 8) & 0o077 if m else 0o777)
    if (role, name) in WIDER_BY_CHOICE:
        mode = WIDER_BY_CHOICE[(role, name)]()
    assert re.match(r"^0?[0-7][0-7]0$", mode), "roles/%s %r: mode %s lets others read it" % (role, name, mode)


def _credentials_mode_default():
    """roles/service's credentials mode is a setting whose default others cannot read; the only role that widens it
    is slurm_metrics, for the Slurm tools' read-only credential (every local user runs the tools; it reads metrics
    and nothing else, and slurm_metrics_tools_group narrows it to a group)."""
    defaults = yaml.safe_load(open(os.path.join(ROOT, "roles", "service", "defaults", "main.yml")))
    widening = sorted(os.path.relpath(path, ROOT).split(os.sep)[1]
                      for path in glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))
                      if "service_tls_credentials_mode:" in open(path, encoding="utf-8").read())
    assert widening == ["slurm_metrics"], widening
    return str(defaults["service_tls_credentials_mode"])


def _hpcobs_files_modes(entries_var):
    """The widest mode among the secret files a hpcobs_files task of roles/service writes with the role's defaults:
    the key and the credentials of the TLS set (hpcobs_tls_files), the web configuration."""
    def widest():
        sys.path.insert(0, os.path.join(ROOT, "playbooks", "filter_plugins"))
        import hpcobs_service  # noqa: E402 (the filter the defaults call)
        defaults = yaml.safe_load(open(os.path.join(ROOT, "roles", "service", "defaults", "main.yml")))
        modes = []
        if "tls" in entries_var:
            files = hpcobs_service.tls_files("/etc/x/tls", "x", "ca", "crt", "key", True, ["cred"], "/pki",
                                             _credentials_mode_default())
            modes += [entry["mode"] for entry in files if not entry["dest"].endswith((".crt",))]
            assert "_service_tls_files" in defaults and "hpcobs_tls_files" in defaults["_service_tls_files"]
        if "web" in entries_var:
            text = defaults["_service_web_config_files"]
            found = re.findall(r"'mode': '([0-7]+)'", text)
            assert found, "no mode in _service_web_config_files"
            modes += found
        return max(modes, key=lambda mode: int(mode, 8) & 0o077)
    return widest


# tasks whose mode is a setting: what it is by default (checked like a literal mode)
WIDER_BY_CHOICE = {
    ("service", "Install the TLS files of {{ service_name }}"): _hpcobs_files_modes("tls"),
    ("service", "Write the web configuration of {{ service_name }}"): _hpcobs_files_modes("web"),
    ("service", "Install the TLS files and the web configuration of {{ service_name }}"):
        _hpcobs_files_modes("tls web"),
}


def test_every_file_task_that_handles_a_secret_is_listed():
    unlisted = ["roles/%s %r" % (role, task.get("name")) for role, _, task in TASKS
                if task.get("no_log") not in (None, False) and (role, task.get("name")) not in SECRET_FILES]
    assert unlisted == [], "file tasks with no_log but not in SECRET_FILES (add them, with diff: false): %s" % unlisted


def test_the_alertmanager_configuration_hides_its_log_when_inline_secrets_are_allowed():
    task = next(t for r, _, t in TASKS if r == "alertmanager" and t.get("name", "").startswith("Write alertmanager.yml"))
    assert "alertmanager_allow_inline_secrets" in str(task.get("no_log"))
