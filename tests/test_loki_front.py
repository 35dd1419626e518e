"""roles/loki/filter_plugins/hpcobs_loki_front.py: the auth config of Loki's vmauth front (hpcobs_security), and its
routes against the real vmauth (the test tools' vmauth, VictoriaMetrics 1.145.0) with a backend that echoes what
reaches it: who may push, who may read, and that no spelling of a path turns a push credential into a read."""
import base64
import importlib.util
import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from tooling import tool

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("hpcobs_loki_front",
                                               REPO / "roles" / "loki" / "filter_plugins" / "hpcobs_loki_front.py")
front = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(front)

READER, PUSHER = "r" * 40, "p" * 40


@pytest.fixture()
def pki(tmp_path):
    (tmp_path / "credentials").mkdir()
    (tmp_path / "credentials" / "loki-client").write_text(READER + "\n")
    (tmp_path / "credentials" / "loki-push-gpu01").write_text(PUSHER)
    return tmp_path


def test_the_reader_reads_and_each_host_with_a_credential_pushes(pki):
    config = front.front_config(["gpu01", "gpu02", "gpu01"], "hpcobs", "127.0.0.1:3101", str(pki))
    users = {user["username"]: user for user in config["users"]}
    assert list(users) == ["hpcobs", "gpu01"]  # gpu02 has no credential yet: no user
    assert users["hpcobs"]["password"] == READER and users["gpu01"]["password"] == PUSHER
    assert users["gpu01"]["url_map"] == [{"src_paths": ["/loki/api/v1/push"], "url_prefix": "http://127.0.0.1:3101"}]
    (read,) = users["hpcobs"]["url_map"]
    assert read["url_prefix"] == "http://127.0.0.1:3101" and "/metrics" in read["src_paths"]
    assert not [path for path in read["src_paths"] if "push" in path or "rules" in path and "prometheus" not in path]
    assert "unauthorized_user" not in config


@pytest.mark.parametrize("hosts,reader,backend,problem", [
    (["gpu 01"], "hpcobs", "127.0.0.1:3101", "cannot be a push user"),
    (["hpcobs"], "hpcobs", "127.0.0.1:3101", "has the name of the reader"),
    ([], "hp cobs", "127.0.0.1:3101", "the reader's user name"),
    ([], "hpcobs", "0.0.0.0:3101", "must listen on loopback"),
    ([], "hpcobs", ":3101", "must listen on loopback"),
    ("gpu01", "hpcobs", "127.0.0.1:3101", "must be a list"),
])
def test_bad_input_is_named(hosts, reader, backend, problem):
    (found,) = front.front_problems(hosts, reader, backend)
    assert problem in found


def test_a_missing_or_short_reader_credential_stops_with_its_path(pki):
    (pki / "credentials" / "loki-client").unlink()
    with pytest.raises(front.AnsibleFilterError, match="run playbooks/pki.yml"):
        front.front_config([], "hpcobs", "127.0.0.1:3101", str(pki))
    (pki / "credentials" / "loki-client").write_text("short")
    with pytest.raises(front.AnsibleFilterError, match="16 or more characters"):
        front.front_config([], "hpcobs", "127.0.0.1:3101", str(pki))


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Echo(BaseHTTPRequestHandler):
    """The backend: answers every request with the method and path that reached it."""

    def log_message(self, *args):
        pass

    def _answer(self):
        body = json.dumps({"method": self.command, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815


@pytest.fixture(scope="module")
def vmauth(tmp_path_factory):
    """The real vmauth with the front's config, TLS from a CA made with openssl, in front of the echo backend."""
    work = tmp_path_factory.mktemp("loki-front")
    (work / "credentials").mkdir()
    (work / "credentials" / "loki-client").write_text(READER)
    (work / "credentials" / "loki-push-gpu01").write_text(PUSHER)
    run = lambda *args: subprocess.run(args, check=True, capture_output=True, cwd=work)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
        "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.crt")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=mgmt",
        "-keyout", "server.key", "-out", "server.csr")
    (work / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", "ext", "-out", "server.crt")
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    config = front.front_config(["gpu01"], "hpcobs", "127.0.0.1:%d" % backend.server_port, str(work))
    (work / "front.yml").write_text(yaml.safe_dump(config))
    binary = str(tool("vmauth"))
    subprocess.run([binary, "-auth.config=%s" % (work / "front.yml"), "-dryRun", "-loggerLevel=ERROR"], check=True)
    port, internal = _free_port(), _free_port()
    proc = subprocess.Popen([binary, "-auth.config=%s" % (work / "front.yml"), "-httpListenAddr=127.0.0.1:%d" % port,
                             "-httpInternalListenAddr=127.0.0.1:%d" % internal, "-tls",
                             "-tlsCertFile=%s" % (work / "server.crt"), "-tlsKeyFile=%s" % (work / "server.key"),
                             "-tlsMinVersion=TLS12", "-loggerLevel=ERROR"])
    context = ssl.create_default_context(cafile=str(work / "ca.crt"))
    base = "https://127.0.0.1:%d" % port
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield base, context
    proc.terminate()
    proc.wait(timeout=10)
    backend.shutdown()


def call(vmauth, path, user=None, method="GET"):
    """(status, body) of a request to the front, the path sent as written (no client-side cleaning)."""
    base, context = vmauth
    request = urllib.request.Request(base + path, data=b"{}" if method == "POST" else None, method=method)
    if user:
        request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


PUSH = "gpu01:" + PUSHER
READ = "hpcobs:" + READER


@pytest.mark.parametrize("path", ["/loki/api/v1/push", "/loki/api/v1/query_range", "/metrics", "/ready"])
def test_without_or_with_a_wrong_credential_401(vmauth, path):
    assert call(vmauth, path)[0] == 401
    assert call(vmauth, path, "gpu01:" + READER)[0] == 401
    assert call(vmauth, path, "gpu02:" + PUSHER)[0] == 401


def test_the_push_user_pushes_and_the_reader_reads(vmauth):
    status, body = call(vmauth, "/loki/api/v1/push", PUSH, "POST")
    assert status == 200 and json.loads(body) == {"method": "POST", "path": "/loki/api/v1/push"}
    for path in ["/loki/api/v1/query_range?query=x", "/loki/api/v1/label/node/values", "/prometheus/api/v1/alerts",
                 "/metrics"]:
        status, body = call(vmauth, path, READ)
        assert status == 200 and json.loads(body)["path"] == path, (path, body)
    assert call(vmauth, "/loki/api/v1/push", READ, "POST")[0] == 400


@pytest.mark.parametrize("path", [
    "/loki/api/v1/query_range", "//loki/api/v1/query_range", "/loki/api/v1//query_range",
    "/loki/api/v1/push/../query_range", "/loki/api/v1/push/%2e%2e/query_range", "/loki/api/v1/push%2F..%2Fquery_range",
    "/loki/api/v1/push/./../query_range", "/loki/api/v1/pushquery_range", "/loki/api/v1/push/", "/x/loki/api/v1/push",
    "/LOKI/API/V1/PUSH", "/loki/api/v1/labels", "/metrics", "/ready", "/config", "/loki/api/v1/rules",
])
def test_no_spelling_of_a_path_turns_the_push_credential_into_a_read(vmauth, path):
    status, body = call(vmauth, path, PUSH)
    assert status == 400 and "missing route" in body, (path, status, body)


@pytest.mark.parametrize("path", [
    "/loki/api/v1/push?x=/loki/api/v1/query_range", "/loki/api/v1/query_range/../push",
    "/loki/api/v1/query_range%2F..%2Fpush", "//loki//api/v1/push",
])
def test_what_the_push_route_takes_reaches_loki_as_the_push_path(vmauth, path):
    """vmauth cleans the path before it matches, and sends the cleaned path on: Loki sees only the push path."""
    status, body = call(vmauth, path, PUSH)
    assert status == 200 and json.loads(body)["path"].split("?")[0] == "/loki/api/v1/push", (path, body)


@pytest.mark.parametrize("path", ["/config", "/services", "/loki/api/v1/rules", "/loki/api/v1/delete",
                                  "/compactor/ring", "/debug/pprof/", "/-/reload", "/flags"])
def test_the_reader_reaches_no_internal_or_write_path(vmauth, path):
    status, body = call(vmauth, path, READ)
    assert status == 400 and "missing route" in body, (path, status, body)
