"""Unit tests of the Grafana stand-in (molecule/standins/grafana/grafana): what stops its start as it stops
Grafana 12's, the admin password kept from the first start and reset by the cli, and the API the scenario reads."""
from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from test_loki_standin import call, free_port, wait_ready

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "molecule" / "standins" / "grafana" / "grafana"
DEFAULTS = REPO / "molecule" / "standins" / "grafana" / "tree" / "conf" / "defaults.ini"


def setup(tmp_path, datasources=None, port=3000):
    home = tmp_path / "grafana" / "12.4.4"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "defaults.ini").write_text(DEFAULTS.read_text())
    (tmp_path / "admin_password").write_text("first-password\n")
    for kind in ("datasources", "dashboards"):
        (tmp_path / "provisioning" / kind).mkdir(parents=True)
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "ok.json").write_text(json.dumps({"uid": "ok", "title": "OK"}))
    (tmp_path / "dashboards" / "untitled.json").write_text(json.dumps({"uid": "untitled", "title": ""}))
    (tmp_path / "dashboards" / "broken.json").write_text("{")
    (tmp_path / "provisioning" / "dashboards" / "p.yaml").write_text(json.dumps({"providers": [
        {"name": "p", "folder": "HPC", "folderUid": "hpcobs", "options": {"path": str(tmp_path / "dashboards")}}]}))
    (tmp_path / "provisioning" / "datasources" / "d.yaml").write_text(json.dumps({"datasources": datasources or [
        {"name": "VM", "uid": "vm", "type": "prometheus", "url": "http://127.0.0.1:9", "isDefault": True}]}))
    ini = tmp_path / "grafana.ini"
    ini.write_text("[paths]\ndata = %s\nprovisioning = %s\n[server]\nhttp_addr = 127.0.0.1\nhttp_port = %d\n"
                   "[security]\nadmin_password = $__file{%s}\n" % (tmp_path / "data", tmp_path / "provisioning",
                                                                  port, tmp_path / "admin_password"))
    return [str(GRAFANA), "--homepath=%s" % home, "--config=%s" % ini]


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, **kwargs)


@pytest.mark.parametrize("datasources,message", [
    ([{"name": "A", "uid": "x", "type": "prometheus", "isDefault": True},
      {"name": "B", "uid": "y", "type": "loki", "isDefault": True}], "Only one datasource per organization"),
    ([{"name": "A", "uid": "x", "type": "prometheus"}, {"name": "B", "uid": "x", "type": "loki"}],
     "uid x is used twice"),
    ([{"name": "A"}], "needs a name and a type"),
])
def test_provisioning_that_stops_grafana_stops_the_standin(tmp_path, datasources, message):
    argv = setup(tmp_path, datasources)
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_an_unreadable_file_reference_stops_the_start(tmp_path):
    argv = setup(tmp_path)
    (tmp_path / "admin_password").unlink()
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and "for $__file{}" in result.stderr


def test_unknown_flags_and_commands_are_refused(tmp_path):
    argv = setup(tmp_path)
    assert "unknown flag: --no-such-flag" in run([argv[0], "server", "--no-such-flag"] + argv[1:]).stderr
    assert run([argv[0], "serve"] + argv[1:]).returncode == 1
    version = run([argv[0], "--version", argv[1]])
    assert version.returncode == 0 and "12.4.4" in version.stdout and "STAND-IN" in version.stdout


def test_api_password_kept_and_reset(tmp_path):
    port = free_port()
    argv = setup(tmp_path, port=port)
    url = "http://127.0.0.1:%d" % port

    def get(path, password):
        auth = base64.b64encode(("admin:%s" % password).encode()).decode()
        status, body = call(url + path, headers={"Authorization": "Basic " + auth})
        return status, json.loads(body)

    proc = subprocess.Popen([argv[0], "server"] + argv[1:], stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(url + "/api/health")
        assert json.loads(call(url + "/api/health")[1]) == {"commit": "hpcobs-standin", "database": "ok",
                                                            "version": "12.4.4"}
        assert get("/api/datasources", "wrong")[0] == 401
        status, (datasource,) = get("/api/datasources", "first-password")
        assert status == 200 and (datasource["uid"], datasource["isDefault"]) == ("vm", True)
        assert get("/api/datasources/uid/vm/health", "first-password")[1]["status"] == "ERROR"  # nothing on :9
        # the dashboard without a title and the invalid one are skipped, as Grafana logs and skips them
        assert [h["uid"] for h in get("/api/search?type=dash-db&folderUIDs=hpcobs", "first-password")[1]] == ["ok"]
        assert get("/api/search?type=dash-db&folderUIDs=other", "first-password")[1] == []
        assert get("/api/dashboards/uid/ok", "first-password")[1]["meta"]["provisioned"] is True
        # a changed file is not taken into account by itself: the database keeps the first password
        (tmp_path / "admin_password").write_text("second-password\n")
        assert get("/api/datasources", "second-password")[0] == 401
        reset = run([argv[0], "cli"] + argv[1:] + ["admin", "reset-admin-password", "--password-from-stdin"],
                    input="second-password\n")
        assert reset.returncode == 0, reset.stderr
        assert get("/api/datasources", "second-password")[0] == 200
        assert get("/api/datasources", "first-password")[0] == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert "failed to load dashboard from file" in proc.stderr.read()


# ------------------------------------------------------------------------------------------------ TLS
def make_ca(work, name):
    """A CA and a certificate it signs for 127.0.0.1/localhost (openssl, as roles/pki makes them)."""
    def run_ssl(*args):
        subprocess.run(["openssl"] + list(args), check=True, capture_output=True, cwd=work)
    run_ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
            name + "-ca.key", "-out", name + "-ca.crt", "-days", "2", "-subj", "/CN=%s CA" % name)
    run_ssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
            name + ".key", "-out", name + ".csr", "-subj", "/CN=localhost")
    (work / (name + ".ext")).write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run_ssl("x509", "-req", "-in", name + ".csr", "-CA", name + "-ca.crt", "-CAkey", name + "-ca.key", "-out",
            name + ".crt", "-days", "2", "-set_serial", "3", "-extfile", name + ".ext")
    return {part: work / ("%s%s" % (name, part)) for part in ("-ca.crt", ".crt", ".key")}


class Upstream:
    """An HTTPS server with basic auth standing for a secured datasource: records what it was sent."""

    def __init__(self, files, user, password):
        import http.server
        import ssl
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, body=b""):
                seen.append((self.command, self.path, self.headers.get("Authorization"), body))
                expected = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
                status, data = (200, b'{"status":"success","data":{"result":[1]}}') \
                    if self.headers.get("Authorization") == expected else (401, b"Unauthorized\n")
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self.reply()

            def do_POST(self):  # noqa: N802
                self.reply(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(files[".crt"], files[".key"])
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = "https://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def https_setup(tmp_path, port, datasources, server=None, metrics=""):
    argv = setup(tmp_path, datasources, port)
    ini = Path(argv[2].split("=", 1)[1])
    text = ini.read_text()
    if server is not None:
        text = text.replace("[server]\n", "[server]\n%s\n" % server)
    ini.write_text(text + metrics)
    return argv


def https_call(url, ca=None, password=None, data=None):
    import ssl

    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    request = urllib.request.Request(url, data=data)
    if password:
        request.add_header("Authorization", "Basic " + base64.b64encode(("admin:" + password).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("server,message", [
    ("protocol = https\ncert_key = /nonexistent.key", "cert_file cannot be empty when using HTTPS"),
    ("protocol = https\ncert_file = /nonexistent.crt", "cert_key cannot be empty when using HTTPS"),
    ("protocol = https\ncert_file = /nonexistent.crt\ncert_key = /nonexistent.key",
     'cannot find SSL cert_file at \\"/nonexistent.crt'),
    ("protocol = h2", "serves http and https only"),
])
def test_https_without_what_it_needs_stops_the_start(tmp_path, server, message):
    argv = https_setup(tmp_path, free_port(), None, server)
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_an_unknown_tls_version_stops_the_start(tmp_path):
    site = make_ca(tmp_path, "site")
    argv = https_setup(tmp_path, free_port(), None, "protocol = https\ncert_file = %s\ncert_key = %s\n"
                       "min_tls_version = TLS1.4" % (site[".crt"], site[".key"]))
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and "unknown tls version: TLS1.4" in result.stderr, result.stderr


def test_https_datasources_with_credentials_and_the_site_ca(tmp_path):
    """Grafana over HTTPS: plain HTTP gets Go's 400, another CA fails the handshake; /metrics asks for its basic
    auth; the datasource proxy and health present the datasource's basic auth (its password read through
    $__file{}) and verify the datasource's certificate against tlsCACert, and fail without them."""
    import ssl

    site, other = make_ca(tmp_path, "site"), make_ca(tmp_path, "other")
    upstream = Upstream(site, "hpcobs", "client-password")
    (tmp_path / "client").write_text("client-password\n")
    secured = {"basicAuth": True, "basicAuthUser": "hpcobs", "jsonData": {"tlsAuthWithCACert": True},
               "secureJsonData": {"basicAuthPassword": "$__file{%s}" % (tmp_path / "client"),
                                  "tlsCACert": "$__file{%s}" % site["-ca.crt"]}}
    datasources = [
        dict({"name": "VM", "uid": "vm", "type": "prometheus", "url": upstream.url, "isDefault": True}, **secured),
        # the same service, but trusting another CA, and without the password
        dict(secured, name="other CA", uid="other-ca", type="prometheus", url=upstream.url,
             secureJsonData={"basicAuthPassword": "$__file{%s}" % (tmp_path / "client"),
                             "tlsCACert": "$__file{%s}" % other["-ca.crt"]}),
        {"name": "no auth", "uid": "no-auth", "type": "prometheus", "url": upstream.url,
         "jsonData": {"tlsAuthWithCACert": True}, "secureJsonData": {"tlsCACert": "$__file{%s}" % site["-ca.crt"]}},
    ]
    port = free_port()
    (tmp_path / "metrics-password").write_text("metrics-password")
    argv = https_setup(tmp_path, port, datasources,
                       "protocol = https\ncert_file = %s\ncert_key = %s\nmin_tls_version = TLS1.2"
                       % (site[".crt"], site[".key"]),
                       "[metrics]\nbasic_auth_username = hpcobs\nbasic_auth_password = $__file{%s}\n"
                       % (tmp_path / "metrics-password"))
    proc = subprocess.Popen([argv[0], "server"] + argv[1:], stderr=subprocess.PIPE, text=True)
    url, ca = "https://127.0.0.1:%d" % port, site["-ca.crt"]
    try:
        for _ in range(75):
            try:
                if https_call(url + "/api/health", ca)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert https_call(url + "/api/health", ca)[0] == 200
        # plain HTTP on the HTTPS port: Go's answer, nothing of Grafana's
        status, body = call("http://127.0.0.1:%d/api/health" % port)
        assert status == 400 and "Client sent an HTTP request to an HTTPS server" in body
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            https_call(url + "/api/health", other["-ca.crt"])
        # /metrics: the credential of [metrics], nothing else
        assert https_call(url + "/metrics", ca)[0] == 401
        assert https_call(url + "/metrics", ca, password="metrics-password")[0] == 401  # user admin, not hpcobs
        auth = base64.b64encode(b"hpcobs:metrics-password").decode()
        request = urllib.request.Request(url + "/metrics", headers={"Authorization": "Basic " + auth})
        with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as answer:
            assert answer.status == 200 and "grafana_build_info" in answer.read().decode()
        # the API shows which secrets are set, never their values
        status, body = https_call(url + "/api/datasources/uid/vm", ca, "first-password")
        shown = json.loads(body)
        assert status == 200 and shown["secureJsonFields"] == {"basicAuthPassword": True, "tlsCACert": True}
        assert (shown["basicAuth"], shown["basicAuthUser"]) == (True, "hpcobs")
        assert "client-password" not in body and "BEGIN CERTIFICATE" not in body
        # through the data proxy: the datasource's credential and CA; the caller must be logged in
        assert https_call(url + "/api/datasources/proxy/uid/vm/api/v1/query?query=up", ca)[0] == 401
        status, body = https_call(url + "/api/datasources/proxy/uid/vm/api/v1/query?query=up", ca, "first-password")
        assert status == 200 and json.loads(body)["status"] == "success"
        status, body = https_call(url + "/api/datasources/proxy/uid/vm/api/v1/query", ca, "first-password",
                                  data=b"query=up")
        assert status == 200
        assert upstream.seen[-1][:2] == ("POST", "/api/v1/query") and upstream.seen[-1][3] == b"query=up"
        assert upstream.seen[-1][2] == "Basic " + base64.b64encode(b"hpcobs:client-password").decode()
        assert json.loads(https_call(url + "/api/datasources/uid/vm/health", ca, "first-password")[1])["status"] == "OK"
        # another CA: the handshake fails, nothing is sent; no credential: the service's 401 comes back
        sent = len(upstream.seen)
        health = json.loads(https_call(url + "/api/datasources/uid/other-ca/health", ca, "first-password")[1])
        assert health["status"] == "ERROR" and "CERTIFICATE_VERIFY_FAILED" in health["message"]
        assert https_call(url + "/api/datasources/proxy/uid/other-ca/api/v1/query?query=up", ca,
                          "first-password")[0] == 502
        assert len(upstream.seen) == sent
        assert https_call(url + "/api/datasources/proxy/uid/no-auth/api/v1/query?query=up", ca,
                          "first-password")[0] == 401
        assert json.loads(https_call(url + "/api/datasources/uid/no-auth/health", ca,
                                     "first-password")[1])["status"] == "ERROR"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        upstream.httpd.shutdown()


def test_an_unreadable_file_in_the_provisioning_stops_the_start(tmp_path):
    argv = setup(tmp_path, [{"name": "VM", "uid": "vm", "type": "prometheus", "url": "http://127.0.0.1:9",
                             "secureJsonData": {"basicAuthPassword": "$__file{/nonexistent/client}"}}])
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and "failed to interpolate value" in result.stderr, result.stderr
