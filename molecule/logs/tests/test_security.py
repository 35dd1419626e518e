"""Loki behind its authenticating front (hpcobs_security on): from a GPU node nobody reads any node's journal, and
pushing takes the host's own credential. The front is the real vmauth of the bundle; Loki is the stand-in, on
loopback of the management host.

From the Promtail node (logs-gpu01), which holds the site CA and its own push credential only:
- without credentials (or with a wrong password) every API is refused with 401: push, query, query_range, labels,
  label values, series, tail, the ruler's listing, /ready, /metrics;
- its push credential pushes, and nothing else: every read path answers vmauth's 400 (no route of that user),
  however the path is written (a doubled slash, dot segments, encoded slashes and dots, the read path in a query
  argument);
- plain HTTP on the front's port is refused, a client trusting another CA fails the handshake,
  and Loki's own port and the front's internal port are not reachable from the network at all.
"""
import shlex
import subprocess
import time
import uuid

import pytest

from helpers import LOKI, MGMT, MGMT_CA, NODE, READER_NETRC, http, node, query
from polling import wait_for

testinfra_hosts = [NODE]

CA = "/etc/promtail/tls/ca.crt"
PUSH_CREDENTIAL = "/etc/promtail/tls/loki-push-%s" % NODE
PUSH_NETRC = "/root/hpcobs-test-push.netrc"
WRONG_NETRC = "/root/hpcobs-test-wrong.netrc"
SELECTOR = '{job="systemd-journal"}'
# (method, path, query arguments) of every API a reader or a shipper might use
APIS = [
    ("POST", "/loki/api/v1/push", None),
    ("GET", "/loki/api/v1/query", {"query": SELECTOR}),
    ("GET", "/loki/api/v1/query_range", {"query": SELECTOR}),
    ("GET", "/loki/api/v1/labels", None),
    ("GET", "/loki/api/v1/label/node/values", None),
    ("GET", "/loki/api/v1/series", {"match[]": SELECTOR}),
    ("GET", "/loki/api/v1/tail", {"query": SELECTOR}),
    ("GET", "/prometheus/api/v1/rules", None),
    ("GET", "/prometheus/api/v1/alerts", None),
    ("GET", "/ready", None),
    ("GET", "/metrics", None),
]
READS = [api for api in APIS if api[0] == "GET"]


@pytest.fixture(scope="module")
def netrcs(host):
    """A netrc with the node's own push credential, and one with a wrong password (printf is a shell builtin: the
    password is in no process's arguments)."""
    host.check_output("umask 077; printf 'machine %s login %s password %%s\\n' \"$(cat %s)\" > %s"
                      % (MGMT, NODE, PUSH_CREDENTIAL, PUSH_NETRC))
    host.check_output("umask 077; printf 'machine %s login %s password not-the-password-0000\\n' > %s"
                      % (MGMT, NODE, WRONG_NETRC))
    yield
    host.check_output("rm -f %s %s" % (PUSH_NETRC, WRONG_NETRC))


def call(host, method, path, params=None, netrc=None, url=LOKI, extra=()):
    body = ["-H", "Content-Type: application/json", "--data-binary", "{\"streams\": []}"] if method == "POST" else []
    return http(host, url + path, params, method=method, status=True, ca=CA, netrc=netrc, extra=list(extra) + body)


@pytest.mark.parametrize("method,path,params", APIS)
def test_without_credentials_every_api_is_refused(host, netrcs, method, path, params):
    assert call(host, method, path, params)[0] == 401
    assert call(host, method, path, params, netrc=WRONG_NETRC)[0] == 401


@pytest.mark.parametrize("method,path,params", READS)
def test_the_push_credential_reads_nothing(host, netrcs, method, path, params):
    code, body = call(host, method, path, params, netrc=PUSH_NETRC)
    assert code == 400, body
    assert "streams" not in body and "loki_build_info" not in body


@pytest.mark.parametrize("path", [
    "//loki/api/v1/query_range",
    "/loki/api/v1//query_range",
    "/loki/api/v1/push/../query_range",
    "/loki/api/v1/push/%2e%2e/query_range",
    "/loki/api/v1/push%2F..%2Fquery_range",
    "/loki/api/v1/pushx/../query_range",
    "/LOKI/API/V1/QUERY_RANGE",
])
def test_path_tricks_do_not_turn_a_push_into_a_read(host, netrcs, path):
    code, body = call(host, "GET", path, {"query": SELECTOR}, netrc=PUSH_NETRC, extra=["--path-as-is"])
    assert code == 400, (path, body)
    assert "streams" not in body


@pytest.mark.parametrize("path", [
    "/loki/api/v1/push?x=/loki/api/v1/query_range&query=%7Bjob%3D%22slurm%22%7D",
    "/loki/api/v1/query_range/../push?query=%7Bjob%3D%22slurm%22%7D",
    "/loki/api/v1/query_range%2F..%2Fpush?query=%7Bjob%3D%22slurm%22%7D",
])
def test_what_the_push_route_takes_reaches_only_the_push_handler(host, netrcs, path):
    """The route is chosen by the cleaned path alone, and Loki gets that cleaned path: a query argument naming a
    read path, or a read path that cleans to the push path, reaches Loki's push handler, which answers a GET with no
    data."""
    code, body = call(host, "GET", path, netrc=PUSH_NETRC, extra=["--path-as-is"])
    assert code not in (200, 204) and "streams" not in body, (code, body)


def test_the_push_credential_pushes_its_own_node(host, netrcs):
    marker = "hpcobs front push %s" % uuid.uuid4().hex
    since = time.time_ns() - 10 ** 9
    stream = '{"streams": [{"stream": {"job": "hpcobs-front-test", "node": "%s"}, "values": [["%d", "%s"]]}]}' % (
        NODE, time.time_ns(), marker)
    result = host.run("curl -sS --max-time 10 -o /dev/null -w '%%{http_code}' --cacert %s --netrc-file %s "
                      "-H 'Content-Type: application/json' --data-binary %s %s/loki/api/v1/push"
                      % (CA, PUSH_NETRC, shlex.quote(stream), LOKI))
    assert result.stdout == "204", result.stdout + result.stderr
    (found,) = wait_for("the pushed line through the front", lambda: query(
        host, '{job="hpcobs-front-test"} |= "%s"' % marker, since), 30)
    assert found["stream"]["node"] == NODE


def test_the_reader_credential_cannot_push_or_reach_loki_internals():
    mgmt = node(MGMT)
    for method, path in [("POST", "/loki/api/v1/push"), ("GET", "/config"), ("GET", "/services"),
                         ("POST", "/loki/api/v1/rules/site"), ("GET", "/loki/api/v1/rules"),
                         ("POST", "/loki/api/v1/delete"), ("GET", "/debug/pprof/"), ("GET", "/-/reload")]:
        code, body = http(mgmt, LOKI + path, method=method, status=True, ca=MGMT_CA, netrc=READER_NETRC)
        assert code == 400, (method, path, code, body)


def test_plain_http_is_refused(host):
    code, body = http(host, LOKI.replace("https://", "http://") + "/loki/api/v1/labels", status=True)
    assert code == 400, body


def test_a_client_trusting_another_ca_fails_the_handshake(host, tmp_path):
    """A CA made here with the controller's openssl, as roles/pki makes the site's: the front's certificate does not
    verify against it."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "1", "-subj", "/CN=not the site CA", "-keyout", str(tmp_path / "other.key"),
                    "-out", str(tmp_path / "other.crt")], check=True, capture_output=True)
    other = (tmp_path / "other.crt").read_text()
    host.check_output("printf '%%s' %s > /root/hpcobs-test-other-ca.crt" % shlex.quote(other))
    result = host.run("curl -sS --max-time 10 --cacert /root/hpcobs-test-other-ca.crt -o /dev/null %s/ready" % LOKI)
    assert result.rc == 60, (result.rc, result.stderr)  # 60: the peer's certificate cannot be verified
    assert call(host, "GET", "/ready")[0] == 401  # with the site CA the handshake succeeds


@pytest.mark.parametrize("port", [3101, 3102])
def test_loki_and_the_fronts_own_endpoints_are_not_on_the_network(host, port):
    result = host.run("curl -sS --max-time 5 -o /dev/null http://%s:%d/ready" % (MGMT, port))
    assert result.rc == 7, (port, result.rc, result.stderr)  # 7: connection refused


def test_the_auth_config_is_readable_by_loki_only_and_no_secret_is_on_a_command_line():
    mgmt = node(MGMT)
    config = mgmt.file("/etc/loki/front.yml")
    assert (config.user, config.group, config.mode) == ("root", "loki", 0o640)
    unit = mgmt.file("/etc/systemd/system/loki-front.service").content_string
    assert "-tls" in unit and "-tlsCertFile=/etc/loki/tls/server.crt" in unit and "password" not in unit.lower()
    assert "-httpInternalListenAddr=127.0.0.1:3102" in unit
    pid = mgmt.check_output("systemctl show -p MainPID --value loki-front")
    argv = mgmt.file("/proc/%s/cmdline" % pid).content_string
    assert "password" not in argv.lower()
    assert mgmt.check_output("systemctl show -p User --value loki-front") == "loki"
