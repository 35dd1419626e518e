"""node_exporter with the site's security switch on (ne-debian13, molecule.yml): /metrics over HTTPS from the site
PKI with basic auth of the client credential node-exporter-client, as VictoriaMetrics' `node` job scrapes it; the
files' modes; a sandbox no weaker than the unit without the flag. The other host keeps the switch off: plain HTTP,
no TLS file, no flag."""
import re

import pytest

from hostchecks import cmdline
from nodeexp import (CA, CONFIG_DIR, PASSWORD_FILE, PLAIN, SECURED, TLS_DIR, USER, WEB_CONFIG, WRONG_PASSWORD_FILE,
                     controller_credential, fetch, write_secret)

testinfra_hosts = [SECURED]

HTTPS = "https://127.0.0.1:9100/metrics"
UNIT = "/etc/systemd/system/node_exporter.service"


@pytest.fixture(scope="module")
def credential(host):
    """The controller's client credential, and a wrong one, in root-only files of the host."""
    password = controller_credential()
    assert len(password) >= 32
    write_secret(host, PASSWORD_FILE, password)
    write_secret(host, WRONG_PASSWORD_FILE, password[:-1] + ("x" if password[-1] != "x" else "y"))
    return password


def test_without_credentials_nothing_is_served(host):
    status, body = fetch(host, HTTPS, ca=CA)
    assert status == 401, body[:300]
    assert "node_exporter_build_info" not in body


def test_a_wrong_password_is_refused(host, credential):
    status, body = fetch(host, HTTPS, ca=CA, user=USER, password_file=WRONG_PASSWORD_FILE)
    assert status == 401, body[:300]
    # the right password for another user name is no credential either
    status, _ = fetch(host, HTTPS, ca=CA, user="admin", password_file=PASSWORD_FILE)
    assert status == 401


def test_plain_http_gets_no_metrics(host, credential):
    # Go answers plain HTTP on its TLS port with 400 "Client sent an HTTP request to an HTTPS server"
    status, body = fetch(host, "http://127.0.0.1:9100/metrics", user=USER, password_file=PASSWORD_FILE)
    assert status in (0, 400), (status, body[:300])
    assert "node_exporter_build_info" not in body


def test_a_client_not_trusting_the_site_ca_fails_the_handshake(host, credential):
    # the system's trust store only: the site CA is not in it
    status, body = fetch(host, HTTPS, user=USER, password_file=PASSWORD_FILE)
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body[:300]


def test_the_site_ca_and_the_credential_read_the_metrics(host, credential):
    status, body = fetch(host, HTTPS, ca=CA, user=USER, password_file=PASSWORD_FILE)
    assert status == 200, body[:300]
    assert "node_exporter_build_info{" in body
    assert re.search(r"^node_uname_info\{.*\} 1$", body, re.M)


def test_other_hosts_reach_it_by_its_name(host, credential):
    """The name VictoriaMetrics dials (the inventory name) is on the certificate: from the other host of the
    scenario, trusting the site CA (copied there), with the credential."""
    import testinfra
    other = testinfra.get_host("podman://" + PLAIN)
    write_secret(other, "/root/site-ca.crt", host.file(CA).content_string)
    write_secret(other, PASSWORD_FILE, credential)
    try:
        status, body = fetch(other, "https://%s:9100/metrics" % SECURED, ca="/root/site-ca.crt", user=USER,
                             password_file=PASSWORD_FILE)
        assert status == 200 and "node_exporter_build_info{" in body, (status, body[:300])
    finally:
        other.check_output("rm -f /root/site-ca.crt %s" % PASSWORD_FILE)


def test_the_files_and_their_modes(host, credential):
    for path, mode in ((CONFIG_DIR, 0o750), (TLS_DIR, 0o750), (WEB_CONFIG, 0o640), (TLS_DIR + "/server.key", 0o640),
                       (TLS_DIR + "/server.crt", 0o644), (CA, 0o644)):
        info = host.file(path)
        assert info.exists, path
        assert (info.user, info.group, info.mode) == ("root", "node_exporter", mode), path
    # the web configuration holds the bcrypt hash of the credential, never the credential itself
    web = host.file(WEB_CONFIG).content_string
    assert credential not in web
    assert re.search(r"^\s+%s: ['\"]?\$2[aby]\$" % USER, web, re.M), web
    assert "cert_file: %s/server.crt" % TLS_DIR in web and "key_file: %s/server.key" % TLS_DIR in web
    assert "min_version: TLS12" in web


def test_the_unit_names_the_web_configuration_and_no_secret(host, credential):
    assert "--web.config.file=%s" % WEB_CONFIG in cmdline(host, "node_exporter")
    unit = host.file(UNIT).content_string
    assert credential not in unit and "Environment" not in unit
    assert credential not in host.check_output("systemctl show -p Environment --value node_exporter")


def _exposure(host, unit):
    out = host.check_output("systemd-analyze security --no-pager %s" % unit)
    line = [x for x in out.splitlines() if "Overall exposure level" in x]
    assert line, out
    return float(line[0].split(":")[1].split()[0])


def test_the_sandbox_is_no_weaker_than_without_the_switch(host):
    """systemd-analyze security of the running unit against the same unit without --web.config.file (what the switch
    off writes), loaded beside it on the same systemd."""
    before = "hpcobs-ne-before.service"
    text = host.file(UNIT).content_string
    assert "--web.config.file=%s" % WEB_CONFIG in text
    # ExecStart= continues over lines (" \\" then one word per line): the word goes with its continuation
    plain = re.sub(r" \\\n\s*--web\.config\.file=\S+", "", text)
    assert "web.config" not in plain
    write_secret(host, "/run/systemd/system/" + before, plain)
    try:
        host.check_output("chmod 0644 /run/systemd/system/%s && systemctl daemon-reload" % before)
        secured, off = _exposure(host, "node_exporter.service"), _exposure(host, before)
        print("node_exporter exposure: %.1f with the switch on, %.1f without" % (secured, off))
        assert secured <= off
        assert secured <= 3.5  # tests/test_service_units.py: the role's own unit before the shared template
    finally:
        host.check_output("rm -f /run/systemd/system/%s && systemctl daemon-reload" % before)


def test_the_other_host_keeps_plain_http():
    """Switch off (ne-debian12): no TLS file, no web configuration, no flag, /metrics over plain HTTP as before."""
    import testinfra
    other = testinfra.get_host("podman://" + PLAIN)
    assert not other.file(CONFIG_DIR).exists
    assert not any(arg.startswith("--web.config.file") for arg in cmdline(other, "node_exporter"))
    status, body = fetch(other, "http://127.0.0.1:9100/metrics")
    assert status == 200 and "node_exporter_build_info{" in body
