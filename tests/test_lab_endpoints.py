"""make lab-status with the security switch on: scripts/lab-endpoints.py trusts the lab's site CA (made here by the
PKI role's own code) and presents a component's client credential where an endpoint asks for one, against a real
HTTPS server on loopback."""
import base64
import http.server
import importlib.util
import os
import ssl
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lab = _load("lab_endpoints", "scripts", "lab-endpoints.py")
pki = _load("hpcobs_pki_check", "roles", "pki", "module_utils", "hpcobs_pki_check.py")
SECRET = "lab-secret-0123456789"


class _Handler(http.server.BaseHTTPRequestHandler):
    """/open answers anyone; /closed only the client user with SECRET (401 otherwise)."""

    def do_GET(self):  # noqa: N802 - the http.server API
        wanted = "Basic " + base64.b64encode(b"hpcobs:" + SECRET.encode()).decode()
        code = 200 if self.path == "/open" or self.headers.get("Authorization") == wanted else 401
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def lab_pki(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("pki"))
    pki.ensure(directory, {"mgmt01": ["mgmt01", "127.0.0.1", "localhost"]}, 397, 30, 3650, "/CN=lab CA")
    os.makedirs(os.path.join(directory, "credentials"), exist_ok=True)
    with open(os.path.join(directory, "credentials", "vmalert-client"), "w", encoding="utf-8") as handle:
        handle.write(SECRET + "\n")
    with open(os.path.join(directory, "credentials", "alertmanager-client"), "w", encoding="utf-8") as handle:
        handle.write("not-the-secret\n")
    return directory


@pytest.fixture(scope="module")
def server(lab_pki):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(lab_pki, "hosts", "mgmt01.crt"), os.path.join(lab_pki, "hosts", "mgmt01.key"))
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "https://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture
def context(lab_pki, monkeypatch):
    monkeypatch.setattr(lab, "PKI", lab_pki)
    return ssl.create_default_context(cafile=os.path.join(lab_pki, "ca.crt"))


def test_an_open_endpoint_is_up_without_a_credential(server, context):
    assert lab.probe(server + "/open", "grafana", context) == "up (open)"


def test_a_closed_endpoint_is_up_with_the_components_client_credential(server, context):
    assert lab.probe(server + "/closed", "vmalert", context) == "up (credential)"


def test_a_wrong_credential_or_none_is_reported_not_hidden(server, context):
    assert lab.probe(server + "/closed", "alertmanager", context) == "HTTP 401"
    assert lab.probe(server + "/closed", "loki", context) == "HTTP 401"  # no credential file in this PKI


def test_a_server_outside_the_lab_ca_is_down(server, context, tmp_path):
    other = str(tmp_path / "other")
    pki.ensure(other, {"x": ["127.0.0.1"]}, 397, 30, 3650, "/CN=another CA")
    state = lab.probe(server + "/open", "grafana", ssl.create_default_context(cafile=os.path.join(other, "ca.crt")))
    assert state.startswith("down (") and "CERTIFICATE_VERIFY_FAILED" in state, state


def test_the_lab_runs_with_the_switch_on_and_its_pki_apart():
    assert lab.lab_security() is True
    with open(os.path.join(ROOT, "inventories", "lab", "group_vars", "all.yml"), encoding="utf-8") as handle:
        assert "hpcobs_pki_dir: \"{{ inventory_dir }}/../../.cache/lab/pki\"" in handle.read()
    assert lab.client_credential("victoriametrics_reader").endswith("/credentials/victoriametrics-reader-client")
