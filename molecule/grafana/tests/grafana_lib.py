"""Helpers of the grafana scenario's tests: the containers' addresses, Grafana's HTTP API over HTTPS (the scenario runs
with the site's security switch on), ansible-playbook runs."""
import functools
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request

import site_tls

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(SCENARIO))
DATA_HOST = "grafana-debian12"  # runs VictoriaMetrics, vmalert, Alertmanager and the simulated GPU node
PORTS = {"grafana-debian12": 3000, "grafana-debian13": 3300}
SITE_PASSWORD = {"grafana-debian12": "Site-Given-Passw0rd-For-Tests"}
OUR_DASHBOARDS = {"hpcobs-executive", "hpcobs-gpu-fleet", "hpcobs-job-account", "hpcobs-slurm"}
COMMUNITY = {"grafana-debian12": set(), "grafana-debian13": {"hpcobs-test-synthetic"}}


def address(name):
    out = subprocess.run(["podman", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                          name], capture_output=True, text=True, check=True).stdout.strip()
    assert out, "no address for %s" % name
    return out


SITE_CA = "ca.crt"
pki, credential = site_tls.pki, site_tls.credential


@functools.lru_cache(maxsize=None)
def names_by_address():
    return {address(name): name for name in PORTS}


def opener(ca=None, user=None, password=None):
    """A urllib opener for the containers' HTTPS: trusting `ca` (default the site CA), with basic auth if given."""
    return site_tls.opener(names_by_address, ca=ca, user=user, password=password)


def grafana_url(name, scheme="https"):
    return "%s://%s:%d" % (scheme, address(name), PORTS[name])


def admin_password(host):
    return host.check_output("cat /etc/grafana/admin_password")


def fetch(url, headers=None, ca=None, data=None):
    """(status, body text) of a request to a container (TLS verified against `ca`, default the site CA)."""
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener(ca).open(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def basic(user, secret):
    return {"Authorization": site_tls.basic(user, secret)}


def api(host, path, password=None, user="admin", auth=True):
    """(status, JSON body) of a GET on the Grafana of this test host, over HTTPS trusting the site CA."""
    headers = basic(user, admin_password(host) if password is None else password) if auth else {}
    status, body = fetch(grafana_url(host.backend.name) + path, headers)
    try:
        return status, json.loads(body or "null")
    except ValueError:
        return status, body


def bundle_manifest():
    path = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "bundle", "manifest.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def ansible_env():
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": os.path.join(ROOT, "roles"),
        "ANSIBLE_FILTER_PLUGINS": os.path.join(ROOT, "playbooks", "filter_plugins"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
    })
    return env


def run_playbook(playbook, limit, *args):
    """Run a playbook of this scenario against Molecule's inventory; returns (rc, json report, stderr)."""
    inventory = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "inventory")
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", inventory, "--limit", limit,
           os.path.join(SCENARIO, playbook)] + list(args)
    proc = subprocess.run(cmd, env=ansible_env(), capture_output=True, text=True, timeout=900, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return proc.returncode, report, proc.stdout[-6000:] + proc.stderr[-3000:]


def task_results(report, name_part):
    """Every host result of the tasks whose name contains name_part."""
    out = []
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            if name_part in task["task"]["name"]:
                out.extend(task["hosts"].values())
    return out


def host_named(name):
    """The testinfra host of one test container (for tests that concern one host, not each)."""
    import testinfra  # pylint: disable=import-outside-toplevel

    return testinfra.get_host("podman://%s" % name)
