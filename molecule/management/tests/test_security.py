"""VictoriaMetrics with the site's security switch on (hpcobs_security), seen from a host that is no management host
(the test helper, as a GPU node would be): without the client credential nothing is read, written or deleted; with
it, deletion and the other admin endpoints still need the admin key; TLS chains to the site CA only; the stack's
own clients (vmalert, the self-scrape) work with the shipped credentials. Alertmanager likewise: without its
credential every API is refused (401), plain HTTP gets 400, another CA fails the handshake, and its gossip takes only
the site certificates of the cluster's hosts. node_exporter too: 401 without its credential, 400 to plain HTTP, the
handshake failing for another CA, the metrics for the credential VictoriaMetrics holds."""
import json
import os
import shlex
import subprocess
import time
import uuid
from urllib.parse import quote

import pytest

from mgmt import (AM, AM_AUTH, AM_TLS, E2E_DIR, HELPER, MANAGEMENT, VMALERT, VMALERT_AUTH, VM_AUTH, VM_TLS, get_json,
                  host, http, post_json, query, run_role, write_file)
from polling import wait_for

VMS = ["https://%s:8428" % name for name in MANAGEMENT]
CA = E2E_DIR + "/ca.crt"
CLIENT = {"ca": CA, "user": "hpcobs", "password_file": E2E_DIR + "/vm-client-password"}
ADMIN_KEY = VM_TLS + "/victoriametrics-admin"
# Deleting every series: what a job on a GPU node must never be able to do.
DELETE_ALL = "/api/v1/admin/tsdb/delete_series?match%5B%5D=" + quote('{__name__=~".+"}')


def history(name):
    """Samples of the self-scrape's `up` over the last hour on one host: a deletion would take them away."""
    return sum(value for _, value in query(name, 'sum(count_over_time(up{job="victoriametrics"}[1h]))'))


def marker():
    return "hpcobs_refusal_probe_%s" % uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def histories():
    before = {name: wait_for("self-scrape history on %s" % name, lambda n=name: history(n), 90) for name in MANAGEMENT}
    return before


@pytest.mark.parametrize("url", VMS)
def test_without_credentials_nothing_is_read_written_or_deleted(url, histories):
    probe = marker()
    refused = {
        "query": http(HELPER, url + "/api/v1/query?query=up", ca=CA),
        "export": http(HELPER, url + "/api/v1/export?match%5B%5D=up", ca=CA),
        "import": http(HELPER, url + "/api/v1/import", '{"metric":{"__name__":"%s"},"values":[1],"timestamps":[%d]}'
                       % (probe, int(time.time() * 1000)), "POST", ca=CA),
        "import prometheus": http(HELPER, url + "/api/v1/import/prometheus", "%s 1\n" % probe, "POST", ca=CA),
        "delete": http(HELPER, url + DELETE_ALL, method="POST", ca=CA),
        "metrics": http(HELPER, url + "/metrics", ca=CA),
    }
    assert {what: status for what, (status, _) in refused.items()} == {what: 401 for what in refused}, refused
    # plain HTTP gets nothing either (VictoriaMetrics answers 400 to HTTP on its TLS port)
    status, body = http(HELPER, url.replace("https://", "http://") + "/api/v1/query?query=up")
    assert status == 400 and '"data"' not in body
    name = url.split("//")[1].split(":")[0]
    time.sleep(3)  # past -search.latencyOffset: an imported sample would be visible now
    assert query(name, "count(%s)" % probe) == []
    assert history(name) >= histories[name]


@pytest.mark.parametrize("url", VMS)
def test_the_client_credential_reads_and_writes_but_cannot_delete(url, histories):
    name = url.split("//")[1].split(":")[0]
    probe = marker()
    status, _ = http(HELPER, url + "/api/v1/import/prometheus", "%s 1\n" % probe, "POST", **CLIENT)
    assert status == 204
    wait_for("the imported probe on %s" % name, lambda: query(name, "count(%s)" % probe) == [({}, 1.0)], 30)
    status, body = http(HELPER, url + "/api/v1/query?query=" + quote("count(%s)" % probe), **CLIENT)
    assert status == 200 and '"1"' in body
    # deletion and every other admin endpoint want the admin key, which the client credential is not
    for path, method in ((DELETE_ALL, "POST"), ("/api/v1/admin/tsdb/delete_series?match%5B%5D=" + probe, "POST"),
                         ("/api/v1/admin/tsdb/delete_series?match%5B%5D=" + probe + "&authKey=wrong", "POST"),
                         ("/snapshot/create", "POST"), ("/internal/force_merge", "GET"),
                         ("/internal/force_flush", "GET"), ("/internal/resetRollupResultCache", "GET"),
                         ("/debug/pprof/heap", "GET"), ("/flags", "GET"), ("/config", "GET")):
        status, body = http(HELPER, url + path, method=method, **CLIENT)
        assert status == 401, "%s %s with the client credential: HTTP %d %s" % (method, path, status, body[:200])
    time.sleep(3)
    assert query(name, "count(%s)" % probe) == [({}, 1.0)]
    assert history(name) >= histories[name]
    # the admin key (on the management host only) deletes: the key the role deployed is the one that works
    status, body = http(name, "https://127.0.0.1:8428/api/v1/admin/tsdb/delete_series?match%5B%5D=" + probe,
                        method="POST", ca=VM_AUTH["ca"], authkey_file=ADMIN_KEY)
    assert status == 204, body[:300]
    wait_for("the probe deleted on %s" % name, lambda: query(name, "count(%s)" % probe) == [], 30)


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A CA that is not the site's, and a client certificate it signed, copied into the helper."""
    work = tmp_path_factory.mktemp("other-ca")
    run = lambda *args: subprocess.run(args, check=True, capture_output=True, cwd=work)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=not the site CA")
    run("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=" + MANAGEMENT[0])
    (work / "ext").write_text("subjectAltName=DNS:%s\nextendedKeyUsage=clientAuth,serverAuth\n" % MANAGEMENT[0])
    run("openssl", "x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-out", "client.crt",
        "-days", "2", "-set_serial", "7", "-extfile", "ext")
    paths = {}
    for part in ("ca.crt", "client.crt", "client.key"):
        paths[part] = "/tmp/other-%s" % part
        write_file(HELPER, paths[part], (work / part).read_text())
    return paths


@pytest.mark.parametrize("url", VMS)
def test_tls_chains_to_the_site_ca_only(url, other_ca):
    # a client trusting another CA refuses VictoriaMetrics' certificate: the handshake fails, nothing is sent
    status, body = http(HELPER, url + "/health", ca=other_ca["ca.crt"])
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body[:300]
    # a certificate of another CA, even one naming a management host, is no credential
    status, _ = http(HELPER, url + "/api/v1/query?query=up", ca=CA, cert=other_ca["client.crt"],
                     key=other_ca["client.key"])
    assert status == 401
    # the site CA verifies it, for the name other hosts use
    assert http(HELPER, url + "/health", ca=CA) == (200, "OK")


@pytest.mark.parametrize("name", MANAGEMENT)
def test_vmalert_evaluates_its_rules_with_the_shipped_credential(name):
    def evaluated():
        groups = get_json(name, VMALERT + "/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        failing = [(rule["name"], rule.get("lastError")) for rule in rules if rule.get("lastError")]
        return rules and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules) and not failing \
            and rules
    rules = wait_for("every rule of vmalert on %s evaluated without error" % name, evaluated, 90)
    assert len(rules) > 20
    # its results and alert states reach VictoriaMetrics through remote write, with no error
    def sent():
        status, text = http(name, VMALERT + "/metrics", **VMALERT_AUTH)
        return status == 200 and metric_sum(text, "vmalert_remotewrite_sent_rows_total") > 0 and text
    text = wait_for("vmalert remote-writing rows on %s" % name, sent, 60)
    assert metric_sum(text, "vmalert_remotewrite_errors_total") == 0


def metric_sum(text, metric):
    """Sum of a metric family's samples in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(metric + " ") or line.startswith(metric + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_certificate_due_is_renewed_and_served():
    """The PKI role renews what is within pki_renew_days of its end (here: every 397-day certificate, under 398),
    the role copies the new one and VictoriaMetrics serves it; clients trusting the site CA carry on."""
    path = VM_TLS + "/server.crt"
    before = {name: host(name).file(path).content_string for name in MANAGEMENT}
    result = run_role("pki", {"pki_renew_days": 398, "pki_cert_days": 800})
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "changed: [%s -> localhost]" % MANAGEMENT[0] in result.stdout, result.stdout[-3000:]
    # every role serving the host certificate installs the renewed one (Alertmanager too: else its next run would;
    # node_exporter's copy is the same roles/service task, left out here for the scenario's time)
    for role in ("victoriametrics", "alertmanager"):
        result = run_role(role)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    served = ("import ssl,sys;sys.stdout.write(ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert("
              "ssl.get_server_certificate(('127.0.0.1',8428)))))")
    for name in MANAGEMENT:
        new = host(name).file(path).content_string
        assert new != before[name]
        pem = host(name).check_output("python3 -c \"%s\"" % served)
        assert pem.split() == new.split()
        assert http(HELPER, "https://%s:8428/health" % name, ca=CA) == (200, "OK")
        assert host(name).file(AM_TLS + "/server.crt").content_string == new
        assert http(name, AM + "/-/ready", **AM_AUTH)[0] == 200


# --- Alertmanager (HTTPS, basic auth of the client credential alertmanager-client, mutual TLS on the gossip) -------

AMS = ["https://%s:9093" % name for name in MANAGEMENT]
GOSSIP_NAME = "alertmanager-gossip.hpcobs.invalid"  # files/components.yml alertmanager.peer_name
# argv: host, port, CA file, client certificate, client key (- for none); prints accepted, closed or refused: <why>
_GOSSIP = (
    "import socket,ssl,sys\n"
    "host,port,ca,cert,key=sys.argv[1:6]\n"
    "ctx=ssl.create_default_context(cafile=ca)\n"
    "if cert!='-': ctx.load_cert_chain(cert,key)\n"
    "try:\n"
    "  s=ctx.wrap_socket(socket.create_connection((host,int(port)),timeout=5),server_hostname=%r)\n"
    "  s.sendall(b'\\x00'); print('closed' if s.recv(16)==b'' else 'answered')\n"
    "except socket.timeout:\n"
    "  print('accepted')\n"
    "except (ssl.SSLError,OSError) as err:\n"
    "  print('refused: %%s' %% err)\n" % GOSSIP_NAME
)


def gossip(name, target, ca, cert=None, key=None):
    """A TLS connection from container `name` to the gossip port of `target`, verifying the gossip name: accepted
    (the peer waits for memberlist's first message), closed, or refused with the reason."""
    words = [target, "9094", ca, cert or "-", key or "-"]
    return host(name).check_output("python3 -c %s %s" % (shlex.quote(_GOSSIP), " ".join(shlex.quote(w) for w in words)))


def am_silence(name):
    """A silence made with the shipped credential on management host `name` (its id)."""
    now = time.time()
    silence = {"matchers": [{"name": "alertname", "value": marker(), "isRegex": False, "isEqual": True}],
               "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
               "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600)),
               "createdBy": "hpcobs refusal test", "comment": "must survive the refused DELETE"}
    status, body = post_json(name, AM + "/api/v2/silences", silence)
    assert status == 200, body[:300]
    return json.loads(body)["silenceID"]


@pytest.mark.parametrize("url", AMS)
def test_alertmanager_without_the_credential_nothing_is_read_sent_or_silenced(url):
    name = url.split("//")[1].split(":")[0]
    probe = marker()
    alert = json.dumps([{"labels": {"alertname": probe, "severity": "critical", "audience": "oncall"}}])
    silence_id = am_silence(name)
    new_silence = json.dumps({"matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
                              "startsAt": "2026-01-01T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z",
                              "createdBy": "a GPU node", "comment": "silence everything"})
    wrong = E2E_DIR + "/am-wrong-password"
    write_file(HELPER, wrong, "not-the-password\n")
    refused = {
        "GET alerts": http(HELPER, url + "/api/v2/alerts", ca=CA),
        "POST alerts": http(HELPER, url + "/api/v2/alerts", alert, "POST", ca=CA),
        "POST silences": http(HELPER, url + "/api/v2/silences", new_silence, "POST", ca=CA),
        "GET silences": http(HELPER, url + "/api/v2/silences", ca=CA),
        "DELETE silence": http(HELPER, url + "/api/v2/silence/" + silence_id, method="DELETE", ca=CA),
        "GET status": http(HELPER, url + "/api/v2/status", ca=CA),
        "metrics": http(HELPER, url + "/metrics", ca=CA),
        "ready": http(HELPER, url + "/-/ready", ca=CA),
        "wrong password": http(HELPER, url + "/api/v2/alerts", alert, "POST", ca=CA, user="hpcobs",
                               password_file=wrong),
        # VictoriaMetrics' client credential is not Alertmanager's
        "another credential": http(HELPER, url + "/api/v2/alerts", alert, "POST", **CLIENT),
    }
    assert {what: status for what, (status, _) in refused.items()} == {what: 401 for what in refused}, refused
    # plain HTTP gets nothing either (Go answers 400 to HTTP on a TLS port)
    status, body = http(HELPER, url.replace("https://", "http://") + "/api/v2/alerts", alert, "POST")
    assert status == 400 and probe not in body
    # nothing changed: the probe alert is not there, the silence is still active, no silence of everything
    time.sleep(2)
    assert get_json(name, AM + "/api/v2/alerts?filter=alertname%3D%22" + probe + "%22") == []
    silences = {s["id"]: s for s in get_json(name, AM + "/api/v2/silences")}
    assert silences[silence_id]["status"]["state"] == "active"
    assert not [s for s in silences.values() if s["createdBy"] == "a GPU node"]
    # with the shipped credential the same calls work (the credential is the one vmalert holds)
    status, _ = http(name, AM + "/api/v2/silence/" + silence_id, method="DELETE", **AM_AUTH)
    assert status == 200


@pytest.mark.parametrize("url", AMS)
def test_alertmanager_tls_chains_to_the_site_ca_only(url, other_ca):
    status, body = http(HELPER, url + "/api/v2/status", ca=other_ca["ca.crt"])
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body[:300]
    # a client certificate of another CA is no credential either
    status, _ = http(HELPER, url + "/api/v2/status", ca=CA, cert=other_ca["client.crt"], key=other_ca["client.key"])
    assert status == 401
    # the site CA verifies it, for the name other hosts use: the refusal is the server's (401), not the handshake
    assert http(HELPER, url + "/-/ready", ca=CA)[0] == 401


def test_gossip_takes_only_site_certificates_of_the_cluster(other_ca):
    """The gossip port: no client certificate, one of another CA, or one of the site CA without the gossip name
    (what a GPU node holds: here the helper's own site certificate) is refused; a peer's certificate is taken."""
    pki = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "pki", "hosts")
    for part in ("crt", "key"):
        with open(os.path.join(pki, "%s.%s" % (HELPER, part)), encoding="utf-8") as handle:
            write_file(HELPER, "/tmp/site-node.%s" % part, handle.read())
    target = MANAGEMENT[0]
    results = {
        "no certificate": gossip(HELPER, target, CA),
        "another CA": gossip(HELPER, target, CA, other_ca["client.crt"], other_ca["client.key"]),
        "site certificate without the gossip name": gossip(HELPER, target, CA, "/tmp/site-node.crt",
                                                           "/tmp/site-node.key"),
    }
    assert all(result.startswith("refused") for result in results.values()), results
    # the other peer, with its own host certificate, is taken (the server waits for memberlist's message)
    assert gossip(MANAGEMENT[1], target, AM_TLS + "/ca.crt", AM_TLS + "/server.crt", AM_TLS + "/server.key") == \
        "accepted"


# --- node_exporter (HTTPS, basic auth of the client credential node-exporter-client) ------------------------------

NE = "https://127.0.0.1:9100"
NE_TLS = "/etc/node_exporter/tls"
# on a management host VictoriaMetrics holds the credential (its `node` job presents it)
NE_AUTH = {"ca": NE_TLS + "/ca.crt", "user": "hpcobs", "password_file": VM_TLS + "/node-exporter-client"}
NES = ["https://%s:9100" % name for name in MANAGEMENT]


@pytest.mark.parametrize("url", NES)
def test_node_exporter_without_its_credential_serves_nothing(url, other_ca):
    name = url.split("//")[1].split(":")[0]
    wrong = E2E_DIR + "/ne-wrong-password"
    write_file(HELPER, wrong, "not-the-password\n")
    refused = {
        "no credential": http(HELPER, url + "/metrics", ca=CA),
        "wrong password": http(HELPER, url + "/metrics", ca=CA, user="hpcobs", password_file=wrong),
        # VictoriaMetrics' client credential is not node_exporter's
        "another credential": http(HELPER, url + "/metrics", **CLIENT),
    }
    assert {what: status for what, (status, _) in refused.items()} == {what: 401 for what in refused}, refused
    assert not any("node_exporter_build_info" in body for _, body in refused.values())
    # plain HTTP gets nothing (Go answers 400 to HTTP on a TLS port), another CA fails the handshake
    status, body = http(HELPER, url.replace("https://", "http://") + "/metrics")
    assert status == 400 and "node_exporter_build_info" not in body
    status, body = http(HELPER, url + "/metrics", ca=other_ca["ca.crt"])
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body[:300]
    # the credential VictoriaMetrics holds reads the metrics, on the host itself and by the name other hosts use
    status, body = http(name, NE + "/metrics", **NE_AUTH)
    assert status == 200 and "node_exporter_build_info{" in body
    for path, mode in (("/etc/node_exporter/web.yml", 0o640), (NE_TLS + "/server.key", 0o640)):
        info = host(name).file(path)
        assert (info.user, info.group, info.mode) == ("root", "node_exporter", mode), path


VMALERTS = ["https://%s:8880" % name for name in MANAGEMENT]


@pytest.mark.parametrize("url", VMALERTS)
def test_vmalert_without_its_credential_shows_and_changes_nothing(url, other_ca):
    # the rules, the alerts (with the jobs' labels), the metrics, a reload and the debug endpoints: 401 from another
    # host without the credential, also with a client certificate of another CA; /health alone answers
    for path, method in (("/api/v1/rules", "GET"), ("/api/v1/alerts", "GET"), ("/vmalert/api/v1/rules", "GET"),
                         ("/metrics", "GET"), ("/-/reload", "POST"), ("/flags", "GET"), ("/debug/pprof/heap", "GET"),
                         ("/vmalert/groups", "GET")):
        status, body = http(HELPER, url + path, method=method, ca=CA)
        assert status == 401, "%s %s without the credential: HTTP %d %s" % (method, path, status, body[:200])
    status, _ = http(HELPER, url + "/api/v1/alerts", ca=CA, user="hpcobs", password_file="/etc/hostname")
    assert status == 401
    status, _ = http(HELPER, url + "/api/v1/alerts", ca=CA, cert=other_ca["client.crt"], key=other_ca["client.key"])
    assert status == 401
    assert http(HELPER, url + "/health", ca=CA) == (200, "OK")
    # plain HTTP on the TLS port gets nothing (vmalert answers 400, like VictoriaMetrics)
    status, body = http(HELPER, url.replace("https://", "http://") + "/api/v1/rules")
    assert status in (0, 400) and "groups" not in body
    # a client trusting another CA refuses vmalert's certificate
    status, body = http(HELPER, url + "/health", ca=other_ca["ca.crt"])
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body[:300]
    # the shipped credential reads the rules
    name = url.split("//")[1].split(":")[0]
    assert get_json(name, VMALERT + "/api/v1/rules")["status"] == "success"
