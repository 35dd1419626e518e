"""VictoriaMetrics' read-only front (roles/victoriametrics filter_plugins/hpcobs_vm_reader.py, hpcobs_security) and
the Slurm tools behind it (roles/slurm_metrics files/hpcobs_vmclient.py), against the real binaries of the test tools:
a victoria-metrics with TLS, basic auth and an admin key, as the role runs it, and the real vmauth with the front's
auth config. The tools read the job and the report through the front with the credential users can read; that
credential imports, deletes and administers nothing."""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

import test_jobstats_report as jr
from tooling import REPO, import_lines, tool

spec = importlib.util.spec_from_file_location(
    "hpcobs_vm_reader", REPO / "roles" / "victoriametrics" / "filter_plugins" / "hpcobs_vm_reader.py")
reader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reader)

FILES = REPO / "roles" / "slurm_metrics" / "files"
CLIENT = "vm-client-password-0123456789abcdef"
READER = "vm-reader-password-0123456789abcdef"
ADMIN = "vm-admin-key-0123456789abcdefghijkl"


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait(port, process, what):
    for _ in range(300):
        assert process.poll() is None, "%s exited: %s" % (what, process.stderr.read().decode())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail("%s did not listen on %d" % (what, port))


def request(url, path, user=None, password=None, method="GET", data=None, cafile=None):
    """(status, body) of one request over https, verified against cafile."""
    req = urllib.request.Request(url + path, data=data, method=method)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=cafile), timeout=20) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("vm-reader")
    creds = work / "credentials"
    creds.mkdir()
    for name, value in (("victoriametrics-client", CLIENT), ("victoriametrics-reader-client", READER),
                        ("victoriametrics-admin", ADMIN)):
        (creds / name).write_text(value + "\n")
    run = lambda *args: subprocess.run(args, check=True, capture_output=True, cwd=work)  # noqa: E731
    for ca in ("ca", "other-ca"):
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days",
            "1", "-subj", "/CN=%s" % ca, "-keyout", ca + ".key", "-out", ca + ".crt")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=mgmt",
        "-keyout", "server.key", "-out", "server.csr")
    (work / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", "ext", "-out", "server.crt")
    tls = ["-tls", "-tlsCertFile=%s" % (work / "server.crt"), "-tlsKeyFile=%s" % (work / "server.key"),
           "-tlsMinVersion=TLS12"]
    vm_port, front_port, internal = _free_port(), _free_port(), _free_port()
    vm = subprocess.Popen([str(tool("victoria-metrics")), "-storageDataPath=%s" % (work / "data"),
                           "-httpListenAddr=127.0.0.1:%d" % vm_port, "-search.latencyOffset=0s", "-loggerLevel=ERROR",
                           "-retentionPeriod=10y", "-httpAuth.username=hpcobs",
                           "-httpAuth.password=file://%s" % (creds / "victoriametrics-client"),
                           "-deleteAuthKey=file://%s" % (creds / "victoriametrics-admin")] + tls,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    front = None
    try:
        _wait(vm_port, vm, "victoria-metrics")
        vm_url = "https://127.0.0.1:%d" % vm_port
        ca = str(work / "ca.crt")
        lines = import_lines(dict(list(jr.JOB.items()) + list(jr.RULES.items())))
        status, body = request(vm_url, "/api/v1/import/prometheus", "hpcobs", CLIENT, "POST",
                               "\n".join(lines).encode(), ca)
        assert status == 204, body
        assert request(vm_url, "/internal/force_flush", "hpcobs", CLIENT, cafile=ca)[0] == 200
        config = reader.reader_front_config("hpcobs", vm_url, ca, str(work))
        (work / "reader.yml").write_text(yaml.safe_dump(config))
        binary = str(tool("vmauth"))
        subprocess.run([binary, "-auth.config=%s" % (work / "reader.yml"), "-dryRun", "-loggerLevel=ERROR"],
                       check=True, capture_output=True)
        front = subprocess.Popen([binary, "-auth.config=%s" % (work / "reader.yml"),
                                  "-httpListenAddr=127.0.0.1:%d" % front_port,
                                  "-httpInternalListenAddr=127.0.0.1:%d" % internal, "-loggerLevel=ERROR"] + tls,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait(front_port, front, "vmauth")
        yield {"work": work, "vm": vm_url, "front": "https://127.0.0.1:%d" % front_port, "ca": ca}
    finally:
        for process in (front, vm):
            if process:
                process.terminate()
                process.wait(timeout=30)


def series_count(stack):
    status, body = request(stack["vm"], "/api/v1/series/count", "hpcobs", CLIENT, cafile=stack["ca"])
    assert status == 200, body
    count = json.loads(body)["data"][0]
    assert count > 0
    return count


def settings(stack, tmp_path, **overrides):
    """A jobstats.conf as the role writes it under the switch, with overrides."""
    values = {"url": stack["front"], "ca_file": stack["ca"], "user": "hpcobs",
              "password_file": str(stack["work"] / "credentials" / "victoriametrics-reader-client")}
    values.update(overrides)
    path = tmp_path / "jobstats.conf"
    path.write_text("# as the slurm_metrics role writes it\n" + "".join("%s = %s\n" % kv for kv in values.items()))
    return dict(os.environ, HPCOBS_JOBSTATS_CONF=str(path))


def tool_run(name, env, *args):
    return subprocess.run(["python3", str(FILES / name), *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_tools_read_the_job_and_the_report_through_the_front(stack, tmp_path):
    env = settings(stack, tmp_path)
    out = tool_run("hpcobs-jobstats", env, "5001", "--lookback", "1d")
    assert out.returncode == 0, out.stderr
    assert "Job 5001  user alice  account physics  partition gpu" in out.stdout
    start = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(jr.REPORT_START))
    end = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(jr.REPORT_END))
    rep = tool_run("hpcobs-report", env, "--start", start, "--end", end, "--out-dir", str(tmp_path))
    assert rep.returncode == 0, rep.stderr
    csv_files = list(tmp_path.glob("*.csv"))
    assert csv_files, rep.stdout
    text = "".join(path.read_text() for path in csv_files)
    assert "physics" in text and "chemistry" in text and "alice" in text


@pytest.mark.parametrize("overrides, refusal", [
    ({"user": "", "password_file": ""}, "401"),                      # no credential
    ({"password_file": "/nonexistent"}, "No such file"),             # the credential unreadable
    ({"ca_file": "OTHER"}, "CERTIFICATE_VERIFY_FAILED"),             # a CA that did not sign the front
])
def test_the_tools_say_why_they_cannot_read(stack, tmp_path, overrides, refusal):
    if overrides.get("ca_file") == "OTHER":
        overrides = {"ca_file": str(stack["work"] / "other-ca.crt")}
    out = tool_run("hpcobs-jobstats", settings(stack, tmp_path, **overrides), "5001", "--lookback", "1d")
    assert out.returncode == 1
    assert refusal in out.stderr and "VictoriaMetrics at https://127.0.0.1:" in out.stderr


@pytest.mark.parametrize("method, path", [
    ("POST", "/api/v1/import/prometheus"), ("POST", "/api/v1/import"), ("POST", "/api/v1/write"),
    ("GET", "/api/v1/import/prometheus"), ("POST", "/api/v1/admin/tsdb/delete_series?match[]=%7Bnode%3D%22gpuA%22%7D"),
    ("GET", "/api/v1/admin/tsdb/delete_series?match[]=%7Bnode%3D%22gpuA%22%7D"), ("GET", "/snapshot/create"),
    ("GET", "/internal/force_merge"), ("GET", "/-/reload"), ("GET", "/flags"), ("GET", "/metrics"),
    ("GET", "/api/v1/query/../import/prometheus"), ("GET", "/api/v1//admin/tsdb/delete_series"),
    ("GET", "/api/v1/query%2F..%2Fimport"), ("GET", "/prometheus/api/v1/import/prometheus"),
])
def test_the_reader_credential_writes_deletes_and_administers_nothing(stack, method, path):
    before = series_count(stack)
    data = b'up{job="forged"} 1\n' if method == "POST" else None
    status, body = request(stack["front"], path, "hpcobs", READER, method, data, stack["ca"])
    assert status in (400, 404), (path, status, body)
    assert series_count(stack) == before
    assert request(stack["front"], "/api/v1/query?query=up%7Bjob%3D%22forged%22%7D", "hpcobs", READER,
                   cafile=stack["ca"])[1].count("forged") == 0


def test_the_front_takes_only_the_reader_credential_and_it_opens_nothing_at_victoriametrics(stack):
    query = "/api/v1/query?query=up"
    assert request(stack["front"], query, "hpcobs", READER, cafile=stack["ca"])[0] == 200
    assert request(stack["front"], query, cafile=stack["ca"])[0] == 401
    assert request(stack["front"], query, "hpcobs", READER + "x", cafile=stack["ca"])[0] == 401
    assert request(stack["front"], query, "hpcobs", CLIENT, cafile=stack["ca"])[0] == 401
    # the credential users can read is not VictoriaMetrics' own
    assert request(stack["vm"], query, "hpcobs", READER, cafile=stack["ca"])[0] == 401
    assert request(stack["vm"], query, cafile=stack["ca"])[0] == 401


@pytest.mark.parametrize("args, problem", [
    (("hpcobs", "http://mgmt01:8428", "/ca.crt"), "must be reached on loopback"),
    (("hpc obs", "https://127.0.0.1:8428", "/ca.crt"), "user name"),
    (("hpcobs", "https://127.0.0.1:8428", "ca.crt"), "absolute path"),
])
def test_bad_input_is_named(tmp_path, args, problem):
    with pytest.raises(reader.AnsibleFilterError, match=problem):
        reader.reader_front_config(*args, str(tmp_path))


def test_a_missing_or_short_credential_stops_with_its_path(tmp_path):
    (tmp_path / "credentials").mkdir()
    with pytest.raises(reader.AnsibleFilterError, match="run playbooks/pki.yml"):
        reader.reader_front_config("hpcobs", "https://127.0.0.1:8428", "/ca.crt", str(tmp_path))
    (tmp_path / "credentials" / "victoriametrics-reader-client").write_text("short")
    (tmp_path / "credentials" / "victoriametrics-client").write_text(CLIENT)
    with pytest.raises(reader.AnsibleFilterError, match="not a credential of 16"):
        reader.reader_front_config("hpcobs", "https://127.0.0.1:8428", "/ca.crt", str(tmp_path))


def test_the_role_writes_the_tools_settings_with_the_front_and_its_credential():
    tasks = (REPO / "roles" / "slurm_metrics" / "tasks" / "install.yml").read_text()
    for line in ("ca_file = /etc/hpcobs/tls/ca.crt", "user = {{ slurm_metrics_client_user }}",
                 "password_file = /etc/hpcobs/tls/{{ 'victoriametrics_reader' | hpcobs_client_credential }}"):
        assert line in tasks
    defaults = yaml.safe_load((REPO / "roles" / "slurm_metrics" / "defaults" / "main.yml").read_text())
    assert "'victoriametrics_reader' if slurm_metrics_security | bool" in defaults["slurm_metrics_vm_url"]
    assert Path(FILES / "hpcobs_vmclient.py").is_file()
