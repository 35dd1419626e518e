"""Grafana with the site's security switch on (hpcobs_security), seen from the controller, a host that holds no
credential of Grafana's: HTTPS only, its certificate chaining to the site CA only, every API but /api/health refused
without a credential; with the shipped credentials the stack's own flow works: each datasource of a secured
component queries VictoriaMetrics through Grafana, and VictoriaMetrics scrapes Grafana's /metrics."""
import json
import subprocess
import urllib.error
from urllib.parse import quote

import pytest

from grafana_lib import DATA_HOST, PORTS, SITE_PASSWORD, basic, credential, fetch, grafana_url
from polling import wait_for

HOSTS = sorted(PORTS)
# Every API the scenario's Grafanas serve, each needing a login (the datasource proxy too): what a job on a GPU node
# must not read.
APIS = ["/api/datasources", "/api/datasources/uid/hpcobs-vm", "/api/datasources/uid/hpcobs-vm/health",
        "/api/datasources/proxy/uid/hpcobs-vm/api/v1/query?query=up", "/api/search?type=dash-db",
        "/api/dashboards/uid/hpcobs-executive", "/metrics"]


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A CA that is not the site's."""
    work = tmp_path_factory.mktemp("other-ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=not the site CA"],
                   check=True, capture_output=True, cwd=work)
    return str(work / "ca.crt")


def admin(name):
    return basic("admin", SITE_PASSWORD.get(name) or subprocess.run(
        ["podman", "exec", name, "cat", "/etc/grafana/admin_password"], capture_output=True, text=True,
        check=True).stdout)


@pytest.mark.parametrize("name", HOSTS)
def test_plain_http_is_refused(name):
    # what Go's HTTPS server answers a plain HTTP request: no page, no API
    status, body = fetch(grafana_url(name, "http") + "/api/datasources", admin(name))
    assert status == 400 and "Client sent an HTTP request to an HTTPS server" in body
    assert "hpcobs-vm" not in body


@pytest.mark.parametrize("name", HOSTS)
def test_a_client_trusting_another_ca_fails_the_handshake(name, other_ca):
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(grafana_url(name) + "/api/health", ca=other_ca)
    # the site CA verifies it, for the name the other hosts use
    status, body = fetch(grafana_url(name) + "/api/health")
    assert status == 200 and json.loads(body)["database"] == "ok"


@pytest.mark.parametrize("name", HOSTS)
def test_without_credentials_every_api_is_refused(name):
    refused = {path: fetch(grafana_url(name) + path)[0] for path in APIS}
    assert refused == {path: 401 for path in APIS}
    wrong = basic("admin", "not-the-password")
    assert {path: fetch(grafana_url(name) + path, wrong)[0] for path in APIS} == {path: 401 for path in APIS}
    # /metrics takes its own credential only: not the admin's
    assert fetch(grafana_url(name) + "/metrics", admin(name))[0] == 401
    status, body = fetch(grafana_url(name) + "/metrics", basic("hpcobs", credential("grafana-client")))
    assert status == 200 and "grafana_build_info" in body


def proxy_query(name, expr):
    """A query through Grafana's datasource proxy to the VictoriaMetrics datasource: Grafana presents the client
    credential and verifies VictoriaMetrics against the site CA."""
    path = "/api/datasources/proxy/uid/hpcobs-vm/api/v1/query?query=" + quote(expr)
    status, body = fetch(grafana_url(name) + path, admin(name))
    assert status == 200, body[:300]
    answer = json.loads(body)
    assert answer["status"] == "success"
    return answer["data"]["result"]


@pytest.mark.parametrize("name", HOSTS)
def test_each_grafana_queries_the_secured_victoriametrics_through_its_datasource(name):
    # the data host's Grafana reads its own VictoriaMetrics at 127.0.0.1, the other one the data host's
    result = proxy_query(name, 'up{job="victoriametrics"}')
    assert [(r["metric"]["node"], r["value"][1]) for r in result] == [(DATA_HOST.split(".")[0], "1")]
    status, body = fetch(grafana_url(name) + "/api/datasources/uid/hpcobs-vm/health", admin(name))
    assert status == 200 and json.loads(body)["status"] == "OK", body


def test_victoriametrics_scrapes_both_grafanas_with_their_credential():
    def both_up():
        result = proxy_query(DATA_HOST, 'up{job="grafana"}')
        up = {r["metric"]["node"]: r["value"][1] for r in result}
        return up if up == {name: "1" for name in HOSTS} else None
    wait_for("VictoriaMetrics scraping both Grafanas over HTTPS with grafana-client", both_up, 90)
