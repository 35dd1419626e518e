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

# VictoriaMetrics runs with the site's security switch on in this scenario: HTTPS from the site CA, basic auth, an
# admin key. On a management host its files are where the role put them; tests read secrets from those files inside
# the container (never on a command line).
VM = "https://127.0.0.1:8428"
VM_TLS = "/etc/victoriametrics/tls"
VM_AUTH = {"ca": VM_TLS + "/ca.crt", "user": "hpcobs", "password_file": VM_TLS + "/victoriametrics-client"}
# Alertmanager too (HTTPS, basic auth): on a management host vmalert holds the client credential.
AM = "https://127.0.0.1:9093"
AM_TLS = "/etc/alertmanager/tls"
AM_AUTH = {"ca": AM_TLS + "/ca.crt", "user": "hpcobs", "password_file": "/etc/vmalert/tls/alertmanager-client"}
# vmalert too (HTTPS, basic auth with its own credential vmalert-client, which it holds to check it).
VMALERT = "https://127.0.0.1:8880"
VMALERT_TLS = "/etc/vmalert/tls"
VMALERT_AUTH = {"ca": VMALERT_TLS + "/ca.crt", "user": "hpcobs", "password_file": VMALERT_TLS + "/vmalert-client"}

# vmagent on the host that remote-writes (molecule.yml host_vars victoriametrics_remote_write): it scrapes there
# instead of VictoriaMetrics; its own endpoints are HTTPS with basic auth (its credential vmagent-client, which it
# holds to check it). The remote-write target ("the site's cluster") on the helper host: plain HTTP, user cluster.
REMOTE_WRITER = "management-debian13"
VMAGENT = "https://127.0.0.1:8429"
VMAGENT_AUTH = {"ca": VM_TLS + "/ca.crt", "user": "hpcobs", "password_file": VM_TLS + "/vmagent-client"}
CLUSTER = "http://127.0.0.1:8428"
CLUSTER_AUTH = {"user": "cluster", "password_file": E2E_DIR + "/cluster-password"}


def scraper(name):
    """The URL of what scrapes on management host `name`: vmagent where it remote-writes, else VictoriaMetrics."""
    return VMAGENT if name == REMOTE_WRITER else VM


# argv: url, data (base64 or -), method, CA file, user, password file, client certificate, client key, file of an
# authKey query argument (- for none)
_FETCH = (
    "import base64,ssl,sys,urllib.request,urllib.error\n"
    "url,data,method,ca,user,pwfile,cert,key,keyfile=sys.argv[1:10]\n"
    "if keyfile!='-': url+=('&' if '?' in url else '?')+'authKey='+open(keyfile).read().strip()\n"
    "data=base64.b64decode(data) if data!='-' else None\n"
    "headers={'Content-Type':'application/json'} if data is not None else {}\n"
    "ctx=ssl.create_default_context(cafile=None if ca=='-' else ca)\n"
    "if cert!='-': ctx.load_cert_chain(cert,key)\n"
    "if user!='-': headers['Authorization']='Basic '+base64.b64encode((user+':'+open(pwfile).read().strip()).encode()).decode()\n"
    "req=urllib.request.Request(url,data=data,method=None if method=='-' else method,headers=headers)\n"
    "try:\n"
    "  resp=urllib.request.urlopen(req,timeout=20,context=ctx); code,body=resp.status,resp.read()\n"
    "except urllib.error.HTTPError as err:\n"
    "  code=err.code\n"
    "  try: body=err.read()\n"
    "  except OSError: body=b''\n"  # a server refusing a request may close before its body is read
    "except OSError as err:\n"
    "  code,body=0,str(err).encode()\n"
    "sys.stdout.write('%d\\n' % code + body.decode('utf-8','replace'))\n"
)


def host(name):
    return testinfra.get_host("podman://" + name)


def http(name, url, data=None, method=None, ca=None, user=None, password_file=None, cert=None, key=None,
         authkey_file=None):
    """(status, body) of an HTTP request made from inside container `name`; status 0 when nothing answered (a
    refused TLS handshake included: the body says why). ca: CA file to trust; user and password_file: basic auth
    (the password read from that file in the container); cert, key: a client certificate; authkey_file: a file
    whose content goes into the authKey query argument."""
    payload = "-" if data is None else base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()
    words = [url, payload, method or "-", ca or "-", user or "-", password_file or "-", cert or "-", key or "-",
             authkey_file or "-"]
    out = host(name).check_output("python3 -c %s %s" % (shlex.quote(_FETCH), " ".join(shlex.quote(w) for w in words)))
    status, _, body = out.partition("\n")
    return int(status), body


def own_auth(url, auth):
    """auth, else the CA and credential a management host uses for a URL of its VictoriaMetrics, Alertmanager or
    vmalert."""
    if auth:
        return auth
    return {VM: VM_AUTH, AM: AM_AUTH, VMALERT: VMALERT_AUTH, VMAGENT: VMAGENT_AUTH}.get(url[:len(VM)], {})


def get_json(name, url, **auth):
    """JSON of a GET that must answer 200; a URL of VictoriaMetrics (VM), Alertmanager (AM) or vmalert (VMALERT)
    carries its CA and credential."""
    status, body = http(name, url, **own_auth(url, auth))
    assert status == 200, "%s from %s: HTTP %d %s" % (url, name, status, body[:300])
    return json.loads(body)


def post_json(name, url, obj, method="POST", **auth):
    return http(name, url, json.dumps(obj), method, **own_auth(url, auth))


def query(name, expr):
    """Instant query against the VictoriaMetrics of management host `name`: list of (labels, float value)."""
    from urllib.parse import quote
    data = get_json(name, VM + "/api/v1/query?query=" + quote(expr))
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
