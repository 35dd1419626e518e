"""Alertmanager as converged by the role: configuration, secrets, routing, cluster, persisted silences, and with the
site's security switch on (this scenario) its web configuration and the gossip's mutual TLS."""
import os

import bcrypt
import pytest
import yaml

from hostchecks import assert_runs_as_its_own_user, cmdline, unit_property
from mgmt import AM, MANAGEMENT, get_json
from polling import wait_for

testinfra_hosts = ["management"]

SECRETS = {
    "oncall_webhook": "http://management-webhook:8080/oncall?token=e2e-oncall-token-7f3a",
    "smtp_password": "e2e-smtp-password-91c2",
    "slack_webhook": "http://management-webhook:8080/slack/T000/B000/e2e-slack-token-5d4e",
    "ops_webhook": "http://management-webhook:8080/ops",
    "physics_webhook": "http://management-webhook:8080/physics-team",
    "teams_webhook": "http://management-webhook:8080/teams",
}


def test_service_runs_as_its_own_user(host):
    assert_runs_as_its_own_user(host, "alertmanager", "alertmanager")


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("CapabilityBoundingSet", ""),
    ("ReadWritePaths", "/var/lib/alertmanager"),
])
def test_unit_is_hardened(host, setting, expected):
    assert unit_property(host, "alertmanager", setting) == expected


def own_address(host, name):
    """The host's address on the scenario network (what its inventory name resolves to there)."""
    return host.check_output("getent ahostsv4 %s" % name).split()[0]


def test_cluster_flags_name_the_other_host(host):
    name = host.check_output("hostname")
    other = [m for m in MANAGEMENT if m != name]
    args = cmdline(host, "alertmanager")
    assert [a for a in args if a.startswith("--cluster.peer=")] == ["--cluster.peer=%s:9094" % o for o in other]
    # gossip binds to and advertises the host's own address, never every address
    address = own_address(host, name)
    assert not address.startswith("127.")
    assert "--cluster.listen-address=%s:9094" % address in args
    assert "--cluster.advertise-address=%s:9094" % address in args
    assert "--storage.path=/var/lib/alertmanager" in args
    assert "--web.external-url=https://%s:9093" % name in args


def test_security_flags_and_files(host):
    """HTTPS and basic auth from the web configuration (the password's bcrypt hash only), mutual TLS on the gossip,
    every file private to root and the service's group."""
    args = cmdline(host, "alertmanager")
    assert "--web.config.file=/etc/alertmanager/web.yml" in args
    assert "--cluster.tls-config=/etc/alertmanager/cluster-tls.yml" in args
    for path, mode in (("/etc/alertmanager/web.yml", 0o640), ("/etc/alertmanager/cluster-tls.yml", 0o640),
                       ("/etc/alertmanager/tls/server.key", 0o640), ("/etc/alertmanager/tls/server.crt", 0o644),
                       ("/etc/alertmanager/tls/ca.crt", 0o644), ("/etc/alertmanager/tls", 0o750)):
        info = host.file(path)
        assert (info.user, info.group, info.mode) == ("root", "alertmanager", mode), path
    password = open(os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "pki", "credentials",
                                 "alertmanager-client"), encoding="utf-8").read().strip()
    web = host.file("/etc/alertmanager/web.yml").content_string
    assert password not in web and password not in " ".join(args)
    assert password not in host.check_output("systemctl cat alertmanager")
    config = yaml.safe_load(web)
    assert config["tls_server_config"]["cert_file"] == "/etc/alertmanager/tls/server.crt"
    assert list(config["basic_auth_users"]) == ["hpcobs"]
    assert bcrypt.checkpw(password.encode(), config["basic_auth_users"]["hpcobs"].encode())
    gossip = yaml.safe_load(host.file("/etc/alertmanager/cluster-tls.yml").content_string)
    assert gossip["tls_server_config"]["client_auth_type"] == "RequireAndVerifyClientCert"
    assert gossip["tls_server_config"]["client_allowed_sans"] == [gossip["tls_client_config"]["server_name"]]
    assert gossip["tls_client_config"]["ca_file"] == "/etc/alertmanager/tls/ca.crt"


def test_cluster_has_both_peers(host):
    """Both peers in the cluster: the gossip runs over mutual TLS here (test_security proves what it refuses)."""
    name = host.check_output("hostname")

    def ready():
        cluster = get_json(name, AM + "/api/v2/status")["cluster"]
        return cluster if cluster["status"] == "ready" and len(cluster["peers"]) == 2 else None
    cluster = wait_for("a ready cluster of 2 peers", ready, timeout=60)
    # each peer is known at its own address: this host's and the other one's
    assert sorted(p["address"] for p in cluster["peers"]) == sorted(
        "%s:9094" % own_address(host, m) for m in MANAGEMENT)


def test_gossip_listens_on_the_own_address_only(host):
    name = host.check_output("hostname")
    address = own_address(host, name)
    # as `ss` sees them in the container: the own address, nothing on 0.0.0.0 or [::]. With the security switch on
    # (this scenario) the gossip is TLS, which carries memberlist's packets over TCP too: no UDP listener at all.
    sockets = host.check_output("ss -H -ltun 'sport = :9094'").splitlines()
    local = sorted((line.split()[0], line.split()[4]) for line in sockets)
    assert local == [("tcp", "%s:9094" % address)], sockets
    assert not host.socket("tcp://0.0.0.0:9094").is_listening
    assert not host.socket("udp://0.0.0.0:9094").is_listening


def test_configuration_file_is_private_and_valid(host):
    config = host.file("/etc/alertmanager/alertmanager.yml")
    assert config.user == "root" and config.group == "alertmanager" and config.mode == 0o640
    assert host.file("/etc/alertmanager").mode == 0o750
    assert host.run("/usr/local/bin/amtool check-config /etc/alertmanager/alertmanager.yml").rc == 0


def test_secrets_are_files_never_inline(host):
    secrets_dir = host.file("/etc/alertmanager/secrets")
    assert secrets_dir.is_directory and secrets_dir.mode == 0o750 and secrets_dir.group == "alertmanager"
    assert sorted(host.check_output("ls /etc/alertmanager/secrets").split()) == sorted(SECRETS)
    for name, value in SECRETS.items():
        secret = host.file("/etc/alertmanager/secrets/" + name)
        assert (secret.user, secret.group, secret.mode) == ("root", "alertmanager", 0o640)
        assert secret.content_string == value
    config = host.file("/etc/alertmanager/alertmanager.yml").content_string
    for value in SECRETS.values():
        assert value not in config
    assert "url_file: /etc/alertmanager/secrets/oncall_webhook" in config
    assert "smtp_auth_password_file: /etc/alertmanager/secrets/smtp_password" in config
    assert "api_url_file: /etc/alertmanager/secrets/slack_webhook" in config
    # the unit and the process never see them either
    assert not any(value in host.check_output("systemctl cat alertmanager") for value in SECRETS.values())
    assert not any(value in " ".join(cmdline(host, "alertmanager")) for value in SECRETS.values())


@pytest.mark.parametrize("labels,receiver", [
    ("alertname=HpcobsGpuEccUncorrectable severity=critical audience=oncall node=gpu01 gpu=0 account=physics",
     "oncall"),
    ("alertname=HpcobsGpuEccUncorrectable severity=critical audience=oncall node=gpu01 gpu=0 account=physics "
     "hpc_job=11", "oncall,physics-team"),
    ("alertname=HpcobsGpuHungJob severity=warning audience=team account=physics hpc_job=12", "physics-team"),
    ("alertname=HpcobsGpuHungJob severity=warning audience=team account=biology hpc_job=13", "teams"),
    ("alertname=HpcobsGpuHungJob severity=warning audience=team hpc_job=14", "teams"),
    ("alertname=HpcobsNodeDown severity=warning audience=ops node=gpu01", "ops"),
    ("alertname=SomethingElse", "ops"),
    ("alertname=HpcobsGpuEccUncorrectable audience=oncall site_route=noc", "noc"),
])
def test_routing(host, labels, receiver):
    out = host.check_output("/usr/local/bin/amtool config routes test --config.file=/etc/alertmanager/alertmanager.yml "
                            "%s 2>/dev/null" % labels)
    assert out.strip() == receiver


def test_route_tree_grouping_and_inhibition(host):
    config = yaml.safe_load(host.file("/etc/alertmanager/alertmanager.yml").content_string)
    route = config["route"]
    assert route["receiver"] == "ops"
    by_audience = {tuple(r["matchers"]): r for r in route["routes"]}
    # the site route comes first
    assert route["routes"][0] == {"matchers": ['site_route="noc"'], "receiver": "noc"}
    oncall = by_audience[('audience="oncall"',)]
    assert oncall["receiver"] == "oncall" and oncall["group_by"] == ["alertname", "node", "gpu"]
    team = by_audience[('audience="team"',)]
    assert team["receiver"] == "teams" and team["group_by"] == ["alertname", "account", "hpc_job"]
    assert team["routes"] == [{"matchers": ['account="physics"'], "receiver": "physics-team"}]
    assert by_audience[('audience="ops"',)]["receiver"] == "ops"
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == ("10s", "10s", "1h")
    inhibit = config["inhibit_rules"]
    assert {"source_matchers": ['alertname="HpcobsNodeDown"'], "equal": ["node"],
            "target_matchers": ['alertname=~"HpcobsGpu.+|HpcobsDcgmExporterSilent|HpcobsTargetDown|HpcobsHost.+'
                                '|HpcobsIpmi.+|HpcobsNvme.+"']} in inhibit
    assert {"source_matchers": ['severity="critical"'], "target_matchers": ['severity=~"warning|info"'],
            "equal": ["alertname", "node", "gpu"]} in inhibit
