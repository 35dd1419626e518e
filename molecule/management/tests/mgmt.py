"""Helpers shared by the management scenario's tests (imported by the test modules; no tests here).

Every HTTP call runs inside a test container (`podman exec ... python3`), where the scenario's services resolve
by name: the controller itself has no route into the podman network.
"""
import base64
import json
import os
import shlex
import subprocess
import sys

import testinfra

MANAGEMENT = ["management-debian12", "management-debian13"]
HELPER = "management-webhook"
E2E_DIR = "/var/lib/hpcobs-e2e"
NOTIFICATIONS = E2E_DIR + "/notifications.jsonl"
SERIES_DIR = E2E_DIR + "/series"
SCENARIO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FETCH = (
    "import base64,sys,urllib.request,urllib.error\n"
    "url,data,method=sys.argv[1],sys.argv[2],sys.argv[3]\n"
    "data=base64.b64decode(data) if data!='-' else None\n"
    "req=urllib.request.Request(url,data=data,method=None if method=='-' else method,\n"
    "  headers={'Content-Type':'application/json'} if data is not None else {})\n"
    "try:\n"
    "  resp=urllib.request.urlopen(req,timeout=20); code,body=resp.status,resp.read()\n"
    "except urllib.error.HTTPError as err:\n"
    "  code,body=err.code,err.read()\n"
    "except OSError as err:\n"
    "  code,body=0,str(err).encode()\n"
    "sys.stdout.write('%d\\n' % code + body.decode('utf-8','replace'))\n"
)


def host(name):
    return testinfra.get_host("podman://" + name)


def http(name, url, data=None, method=None):
    """(status, body) of an HTTP request made from inside container `name`; status 0 when nothing answered."""
    payload = "-" if data is None else base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()
    out = host(name).check_output("python3 -c %s %s %s %s" % (
        shlex.quote(_FETCH), shlex.quote(url), shlex.quote(payload), shlex.quote(method or "-")))
    status, _, body = out.partition("\n")
    return int(status), body


def get_json(name, url):
    status, body = http(name, url)
    assert status == 200, "%s from %s: HTTP %d %s" % (url, name, status, body[:300])
    return json.loads(body)


def post_json(name, url, obj, method="POST"):
    return http(name, url, json.dumps(obj), method)


def query(name, expr):
    """Instant query against the VictoriaMetrics of management host `name`: list of (labels, float value)."""
    from urllib.parse import quote
    data = get_json(name, "http://127.0.0.1:8428/api/v1/query?query=" + quote(expr))
    return [(r["metric"], float(r["value"][1])) for r in data["data"]["result"]]


def main_pid(name, unit):
    return int(host(name).check_output("systemctl show -p MainPID --value %s" % unit))


def write_file(name, path, content):
    """Write a file in container `name` atomically (temporary file in the same directory, then rename)."""
    encoded = base64.b64encode(content.encode()).decode()
    host(name).check_output("echo %s | base64 -d > %s.tmp && mv %s.tmp %s" % (
        encoded, shlex.quote(path), shlex.quote(path), shlex.quote(path)))


def notifications():
    """Every notification the webhook helper recorded, oldest first."""
    out = host(HELPER).check_output("cat %s 2>/dev/null || true" % NOTIFICATIONS)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_role(role, extra_vars=None, tags=None):
    """Run one role of the scenario on the management hosts (its group_vars, plus extra_vars on top)."""
    beside = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    cmd = [beside if os.path.exists(beside) else "ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
           os.path.join(SCENARIO_DIR, "apply_role.yml"), "-e", json.dumps({"scenario_role": role})]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    if tags:
        cmd += ["--tags", tags]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PY_COLORS="0")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
