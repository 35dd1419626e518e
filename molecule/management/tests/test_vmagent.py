"""Beyond one host: management-debian13 sets victoriametrics_remote_write (molecule.yml host_vars), so vmagent scrapes
there instead of VictoriaMetrics and writes every sample to the local VictoriaMetrics and to "the site's cluster", a
single-node VictoriaMetrics with basic auth on the helper host (prepare.yml). management-debian12 keeps today's
setup: VictoriaMetrics scrapes, no vmagent."""
from urllib.parse import quote

from hostchecks import assert_runs_as_its_own_user, cmdline
from mgmt import (CLUSTER, CLUSTER_AUTH, HELPER, MANAGEMENT, REMOTE_WRITER, VM, VM_TLS, VMAGENT, VMAGENT_AUTH, get_json,
                  host, http, query)
from polling import wait_for

SECRET = "/etc/victoriametrics/remote-write/cluster.password"


def cluster_series(match):
    """Series of the remote-write target matching `match`, read on the helper host with its credential."""
    data = get_json(HELPER, CLUSTER + "/api/v1/series?match[]=" + quote(match), **CLUSTER_AUTH)
    return data["data"]


def test_vmagent_runs_only_where_remote_write_is_set():
    writer = host(REMOTE_WRITER)
    assert_runs_as_its_own_user(writer, "vmagent", "victoriametrics")
    for name in MANAGEMENT:
        if name != REMOTE_WRITER:
            assert not host(name).file("/etc/systemd/system/vmagent.service").exists


def test_vmagent_flags_name_files_never_secrets():
    writer = host(REMOTE_WRITER)
    args = cmdline(writer, "vmagent")
    assert args[0] == "/usr/local/bin/vmagent"
    for flag in ("-promscrape.config=/etc/victoriametrics/scrape.yml", "-remoteWrite.tmpDataPath=/var/lib/vmagent",
                 "-remoteWrite.maxDiskUsagePerURL=10GiB",
                 "-remoteWrite.url=https://127.0.0.1:8428/api/v1/write",
                 "-remoteWrite.url=http://management-webhook:8428/api/v1/write",
                 "-remoteWrite.basicAuth.username=hpcobs", "-remoteWrite.basicAuth.username=cluster",
                 "-remoteWrite.basicAuth.passwordFile=%s/victoriametrics-client" % VM_TLS,
                 "-remoteWrite.basicAuth.passwordFile=" + SECRET, "-remoteWrite.tlsCAFile=%s/ca.crt" % VM_TLS,
                 "-tls", "-httpAuth.username=hpcobs", "-httpAuth.password=file://%s/vmagent-client" % VM_TLS):
        assert flag in args, flag
    # the local write first, then the site's: the array flags line up by position
    urls = [arg for arg in args if arg.startswith("-remoteWrite.url=")]
    assert urls[0].endswith("127.0.0.1:8428/api/v1/write") and len(urls) == 2
    secret = writer.file(SECRET)
    assert (secret.user, secret.group, secret.mode) == ("root", "victoriametrics", 0o640)
    password = secret.content_string.strip()
    assert len(password) >= 32
    unit = writer.file("/etc/systemd/system/vmagent.service").content_string
    assert password not in " ".join(args) and password not in unit
    assert password not in writer.check_output("systemctl show -p Environment --value vmagent")
    assert password not in writer.check_output("journalctl -u vmagent --no-pager -q -n 500 || true")
    state = writer.file("/var/lib/vmagent")
    assert state.is_directory and state.user == "victoriametrics" and state.mode == 0o750
    assert writer.check_output("systemctl show -p ReadWritePaths --value vmagent").strip() == "/var/lib/vmagent"
    assert writer.check_output("systemctl show -p ProtectSystem --value vmagent").strip() == "strict"


def test_samples_arrive_at_the_remote_write_target():
    # vmagent scrapes every job of the role's scrape configuration; both management hosts' node_exporter reach the
    # site's VictoriaMetrics through it
    def both():
        nodes = {labels.get("node") for labels in cluster_series('up{job="node"}')}
        return set(MANAGEMENT) <= nodes and nodes
    wait_for("node series of both management hosts at the remote-write target", both, timeout=90)
    # and the local VictoriaMetrics has them too (vmalert and Grafana read it)
    up = wait_for("up{job=node} in the local VictoriaMetrics of %s" % REMOTE_WRITER,
                  lambda: query(REMOTE_WRITER, 'up{job="node"} == 1'), 60)
    assert {labels["node"] for labels, _ in up} == set(MANAGEMENT)


def test_the_remote_write_target_refuses_without_its_password():
    status, _ = http(HELPER, CLUSTER + "/api/v1/series?match[]=up")
    assert status == 401


def test_vmagent_serves_its_metrics_only_with_its_credential():
    status, body = http(REMOTE_WRITER, VMAGENT + "/metrics", **VMAGENT_AUTH)
    assert status == 200 and "vmagent_remotewrite_requests_total" in body
    status, _ = http(REMOTE_WRITER, VMAGENT + "/metrics", ca=VMAGENT_AUTH["ca"])
    assert status == 401
    # the other management host scrapes vmagent's own metrics (job vmagent) over HTTPS with the credential
    other = [name for name in MANAGEMENT if name != REMOTE_WRITER][0]
    up = wait_for("up{job=vmagent} on %s" % other, lambda: query(other, 'up{job="vmagent"}'), 60)
    assert [(labels["node"], value) for labels, value in up] == [(REMOTE_WRITER, 1.0)]


def test_nothing_is_scraped_twice_on_the_writer():
    # VictoriaMetrics there has no scrape configuration: its own scrape metrics show no target
    data = get_json(REMOTE_WRITER, VM + "/api/v1/targets")
    assert not (data.get("data") or {}).get("activeTargets"), data
