"""The Slurm scheduler metrics' front under the security switch: the settings check of roles/slurm_metrics
(filter_plugins/hpcobs_slurm_metrics.py front_problems), the shared vmauth auth config (hpcobs_front_config in
playbooks/filter_plugins/hpcobs_service.py), and that config served by the real vmauth with TLS in front of a
stand-in collector on loopback (the role's end-to-end on real Slurm: molecule/slurm)."""
import base64
import http.server
import importlib.util
import os
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml
from tooling import tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slurm = _load("hpcobs_slurm_metrics", "roles", "slurm_metrics", "filter_plugins", "hpcobs_slurm_metrics.py")
service = _load("hpcobs_service", "playbooks", "filter_plugins", "hpcobs_service.py")

GOOD = dict(security=True, listen="0.0.0.0:9341", backend="127.0.0.1:9342", internal="127.0.0.1:9343",
            tls_min_version="TLS12", config_dir="/etc/hpcobs-slurm-metrics", client_user="hpcobs")
PASSWORD = "s3cret-credential-0123456789"
ROUTES = [{"src_paths": ["/metrics"], "url_prefix": "http://127.0.0.1:9342"}]


def problems(**changes):
    return slurm.front_problems(**dict(GOOD, **changes))


def test_the_defaults_pass_and_without_the_switch_nothing_is_checked():
    assert problems() == []
    assert problems(backend="[::1]:9342", internal="127.0.0.2:9343") == []
    assert problems(security=False, backend="0.0.0.0:9342", tls_min_version="SSL3") == []


@pytest.mark.parametrize("changes,expected", [
    ({"backend": "0.0.0.0:9342"}, "slurm_metrics_backend_listen_address must be a loopback address"),
    ({"backend": ":9342"}, "slurm_metrics_backend_listen_address must be a loopback address"),
    ({"backend": "10.0.0.5:9342"}, "slurm_metrics_backend_listen_address must be a loopback address"),
    ({"internal": "127.0.0.1"}, "slurm_metrics_front_internal_listen_address must be a loopback address"),
    ({"internal": "127.0.0.1:0"}, "slurm_metrics_front_internal_listen_address must be a loopback address"),
    ({"backend": "127.0.0.1:9341"}, "need three different ports (got 9341, 9341, 9343)"),
    ({"tls_min_version": "TLS10"}, "slurm_metrics_tls_min_version must be TLS12 or TLS13"),
    ({"config_dir": "etc/x"}, "slurm_metrics_config_dir must be an absolute directory of its own"),
    ({"config_dir": "/etc"}, "slurm_metrics_config_dir must be an absolute directory of its own"),
    ({"client_user": "a b"}, "slurm_metrics_client_user must be letters, digits"),
])
def test_each_bad_setting_is_named(changes, expected):
    found = problems(**changes)
    assert len(found) == 1 and expected in found[0], found


def test_front_config_gives_the_routes_to_one_user_or_to_anybody():
    assert service.front_config(ROUTES, "hpcobs", PASSWORD) == {
        "users": [{"username": "hpcobs", "password": PASSWORD, "url_map": ROUTES}]}
    assert service.front_config(ROUTES) == {"unauthorized_user": {"url_map": ROUTES}}


@pytest.mark.parametrize("routes,user,password,expected", [
    ([], "", "", "the routes must be a non-empty list"),
    ([{"src_paths": ["/metrics"]}], "", "", "each route needs src_paths and an http(s) url_prefix"),
    ([{"url_prefix": "http://127.0.0.1:1"}], "", "", "each route needs src_paths"),
    ([{"src_paths": ["/m"], "url_prefix": "file:///etc/shadow"}], "", "", "an http(s) url_prefix"),
    (ROUTES, "a:b", PASSWORD, "the client user 'a:b' must be letters"),
    (ROUTES, "hpcobs", "short", "is not one line of 16 or more characters"),
    (ROUTES, "hpcobs", PASSWORD + "\nUser=root", "is not one line of 16 or more characters"),
])
def test_front_config_refuses_what_vmauth_should_not_get(routes, user, password, expected):
    with pytest.raises(service.AnsibleFilterError) as err:
        service.front_config(routes, user, password)
    assert expected in str(err.value)
    assert PASSWORD not in str(err.value)  # a credential is never put in a message


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """The real vmauth with the role's flags (-tls, an internal listener) and hpcobs_front_config's auth config,
    before a stand-in collector on loopback that serves /metrics (and would serve anything else)."""
    work = tmp_path_factory.mktemp("slurm-front")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(work / "server.key"), "-out", str(work / "server.crt"), "-days", "1",
                    "-subj", "/CN=ctl1", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ('hpcobs_slurm_collector_success{command="nodes"} 1\n# path %s\n' % self.path).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    routes = [{"src_paths": ["/metrics"], "url_prefix": "http://127.0.0.1:%d" % backend.server_port}]
    (work / "front.yml").write_text(yaml.safe_dump(service.front_config(routes, "hpcobs", PASSWORD)))
    check = subprocess.run([str(tool("vmauth")), "-auth.config=%s" % (work / "front.yml"), "-dryRun",
                            "-loggerLevel=ERROR"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    port, internal = _free_port(), _free_port()
    proc = subprocess.Popen([str(tool("vmauth")), "-auth.config=%s" % (work / "front.yml"),
                             "-httpListenAddr=127.0.0.1:%d" % port, "-httpInternalListenAddr=127.0.0.1:%d" % internal,
                             "-tls", "-tlsCertFile=%s" % (work / "server.crt"), "-tlsKeyFile=%s" % (work / "server.key"),
                             "-tlsMinVersion=TLS12", "-loggerLevel=ERROR"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ctx = ssl.create_default_context(cafile=str(work / "server.crt"))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen("https://127.0.0.1:%d/health" % internal, timeout=2, context=ctx)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "vmauth did not start"
                time.sleep(0.2)
        yield {"url": "https://127.0.0.1:%d" % port, "ctx": ctx, "port": port}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        backend.shutdown()


def get(front, path, user=None, password=None, ctx=None):
    request = urllib.request.Request(front["url"] + path)
    if user:
        request.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=ctx or front["ctx"]) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_without_the_credential_nothing_is_served(front):
    for path in ("/metrics", "/", "/health", "/metrics?x=1", "/flags"):
        assert get(front, path)[0] == 401, path
    assert get(front, "/metrics", "hpcobs", "wrong-password-0123456")[0] == 401
    assert get(front, "/metrics", "somebody", PASSWORD)[0] == 401


def test_the_credential_reads_metrics_and_nothing_else(front):
    status, body = get(front, "/metrics", "hpcobs", PASSWORD)
    assert status == 200 and 'hpcobs_slurm_collector_success{command="nodes"} 1' in body
    for path in ("/", "/health", "/flags", "/-/reload", "/metrics/x", "/debug/pprof/heap"):
        assert get(front, path, "hpcobs", PASSWORD)[0] == 400, path


def test_plain_http_and_another_ca_get_nothing(front):
    with socket.create_connection(("127.0.0.1", front["port"]), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = conn.recv(200)
    assert answer.startswith(b"HTTP/1.0 400") and b"slurm" not in answer
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(front, "/metrics", "hpcobs", PASSWORD, ctx=ssl.create_default_context())
