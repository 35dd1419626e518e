"""The site PKI (roles/pki): what a host's certificate names, when it is renewed, and the openssl run itself on a
temporary directory (the real openssl of the controller): CA and certificates made once, nothing made again, a
certificate due or naming other hosts or signed by another CA made anew, check mode writing nothing."""
import datetime
import importlib.util
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pki = _load("hpcobs_pki_check", "roles", "pki", "module_utils", "hpcobs_pki_check.py")
service = _load("hpcobs_service", "playbooks", "filter_plugins", "hpcobs_service.py")
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)


def test_sans_name_the_host_every_way_it_is_reached_once():
    hostvars = {"m1": {"ansible_host": "10.0.0.1", "hpcobs_address": "m1.mgmt.example"},
                "m2": {"hpcobs_address": "fd00::2"}, "m3": {"ansible_host": "m3"}}
    assert service.pki_sans("m1", hostvars) == ["m1", "10.0.0.1", "m1.mgmt.example", "127.0.0.1", "localhost"]
    assert service.pki_sans("m2", hostvars) == ["m2", "fd00::2", "127.0.0.1", "localhost"]
    assert service.pki_sans("m3", hostvars) == ["m3", "127.0.0.1", "localhost"]
    assert service.pki_sans("absent", hostvars) == ["absent", "127.0.0.1", "localhost"]
    assert service.pki_hosts_sans(["m3"], hostvars) == {"m3": ["m3", "127.0.0.1", "localhost"]}
    with pytest.raises(service.AnsibleFilterError, match="cannot be a certificate name"):
        service.pki_sans("x", {"x": {"hpcobs_address": "a,DNS:evil"}})


def test_hosts_of_a_component_with_a_peer_name_carry_it():
    """Alertmanager's gossip peers verify the name of files/components.yml (they dial each other by IP address):
    the certificates of the management hosts carry it, a GPU node's does not."""
    hostvars = {"m1": {"group_names": ["management"], "hpcobs_address": "10.0.0.1"},
                "g1": {"group_names": ["gpu_nodes"]}}
    name = service.load_components()["alertmanager"]["peer_name"]
    assert service.peer_names("m1", hostvars) == [name]
    assert service.pki_sans("m1", hostvars) == ["m1", "10.0.0.1", "127.0.0.1", "localhost", name]
    assert service.peer_names("g1", hostvars) == [] and name not in service.pki_sans("g1", hostvars)
    assert service.peer_names("absent", hostvars) == []


def test_san_entries_tell_addresses_from_names():
    assert pki.san_entries(["gpu01", "10.0.0.1", "fd00::2", "localhost"]) == [
        "DNS:gpu01", "IP:10.0.0.1", "IP:fd00::2", "DNS:localhost"]


def _info(days_left, sans=("DNS:m1", "IP:127.0.0.1"), aki="AB"):
    return {"not_after": NOW + datetime.timedelta(days=days_left), "sans": set(sans), "aki": aki}


@pytest.mark.parametrize("info,expected", [
    (None, "missing"),
    ({"not_after": None, "sans": set(), "aki": ""}, "unreadable"),
    (_info(29), "within 30 days"),
    (_info(31), ""),
    (_info(200, sans=("DNS:m1",)), "names DNS:m1, not"),
    (_info(200, aki="CD"), "signed by another CA"),
])
def test_renewal_decision(info, expected):
    reason = pki.renewal_reason(info, ["m1", "127.0.0.1"], "AB", 30, now=NOW)
    assert (reason == "" if expected == "" else expected in reason), reason


def test_parse_openssl_output():
    text = ("notAfter=Jan  2 18:50:20 2028 GMT\nX509v3 Subject Alternative Name: \n"
            "    DNS:mgmt02, IP Address:FD00:0:0:0:0:0:0:2, IP Address:127.0.0.1, DNS:localhost\n"
            "X509v3 Authority Key Identifier: \n    6A:1B:FF\n")
    info = pki.parse_x509_text(text)
    assert info["not_after"] == datetime.datetime(2028, 1, 2, 18, 50, 20, tzinfo=datetime.timezone.utc)
    assert info["sans"] == {"DNS:mgmt02", "IP:fd00::2", "IP:127.0.0.1", "DNS:localhost"}
    assert info["aki"] == "6A1BFF"
    assert pki.parse_ski_text("X509v3 Subject Key Identifier: \n    6A:1B:FF\n") == "6A1BFF"


def _mode(path):
    return os.stat(path).st_mode & 0o777


def test_ensure_makes_once_then_nothing_and_renews_what_is_due(tmp_path):
    directory = str(tmp_path / "pki")
    hosts = {"m1": ["m1", "10.0.0.1", "127.0.0.1", "localhost"], "gpu01": ["gpu01", "127.0.0.1", "localhost"]}
    # check mode on nothing: it reports the CA and both hosts, and writes nothing
    planned = pki.ensure(directory, hosts, 397, 30, 3650, "/CN=test CA", check_mode=True)
    assert planned["ca_created"] and set(planned["issued"]) == {"m1", "gpu01"} and not os.path.exists(directory)
    made = pki.ensure(directory, hosts, 397, 30, 3650, "/CN=test CA")
    assert made["ca_created"] and set(made["issued"]) == {"m1", "gpu01"}
    assert _mode(directory) == 0o700 and _mode(directory + "/ca.key") == 0o600 and _mode(directory + "/hosts/m1.key") == 0o600
    verify = subprocess.run(["openssl", "verify", "-CAfile", directory + "/ca.crt", directory + "/hosts/m1.crt"],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(["openssl", "x509", "-in", directory + "/hosts/m1.crt", "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "DNS:m1, IP Address:10.0.0.1, IP Address:127.0.0.1, DNS:localhost" in text
    assert "TLS Web Server Authentication" in text and "CA:FALSE" in text
    # second run: nothing to do, nothing rewritten
    before = {name: os.stat(directory + "/hosts/" + name).st_mtime_ns for name in os.listdir(directory + "/hosts")}
    again = pki.ensure(directory, hosts, 397, 30, 3650, "/CN=test CA")
    assert again == {"ca_created": False, "issued": {}, "ca_expires": again["ca_expires"]} and again["ca_expires"]
    assert before == {name: os.stat(directory + "/hosts/" + name).st_mtime_ns for name in os.listdir(directory + "/hosts")}
    # a run 17 days before the end (fewer than renew_days left) renews both
    due = pki.ensure(directory, hosts, 397, 30, 3650, "/CN=test CA", check_mode=True,
                     now=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=380))
    assert set(due["issued"]) == {"m1", "gpu01"} and "within 30 days" in due["issued"]["m1"]
    # a host whose address changed gets a certificate naming the new one; the other is left alone
    moved = dict(hosts, m1=["m1", "10.0.0.9", "127.0.0.1", "localhost"])
    renewed = pki.ensure(directory, moved, 397, 30, 3650, "/CN=test CA")
    assert list(renewed["issued"]) == ["m1"] and "names" in renewed["issued"]["m1"]
    assert pki.ensure(directory, moved, 397, 30, 3650, "/CN=test CA")["issued"] == {}


def test_a_ca_key_without_its_certificate_is_never_overwritten(tmp_path):
    directory = tmp_path / "pki"
    directory.mkdir(mode=0o700)
    (directory / "ca.key").write_text("the site's key")
    with pytest.raises(ValueError, match="exists without its certificate"):
        pki.ensure(str(directory), {"m1": ["m1"]}, 397, 30, 3650, "/CN=x")
    assert (directory / "ca.key").read_text() == "the site's key"


def test_the_sites_own_ca_without_its_key_signs_nothing(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    subprocess.run(pki.ca_args(str(own / "ca.key"), str(own / "ca.crt"), 30, "/CN=site"), check=True,
                   capture_output=True)
    with pytest.raises(ValueError, match="no key of the site CA"):
        pki.ensure(str(tmp_path / "pki"), {"m1": ["m1"]}, 397, 30, 3650, "/CN=x", ca_cert=str(own / "ca.crt"))
    # with its key, the site's CA signs the hosts' certificates and no CA of the role's is made
    made = pki.ensure(str(tmp_path / "pki"), {"m1": ["m1"]}, 397, 30, 3650, "/CN=x", ca_cert=str(own / "ca.crt"),
                      ca_key=str(own / "ca.key"))
    assert not made["ca_created"] and list(made["issued"]) == ["m1"]
    assert not (tmp_path / "pki" / "ca.crt").exists()
    assert subprocess.run(["openssl", "verify", "-CAfile", str(own / "ca.crt"), str(tmp_path / "pki/hosts/m1.crt")],
                          capture_output=True).returncode == 0


def test_bad_host_names_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="cannot be a certificate file name"):
        pki.ensure(str(tmp_path / "pki"), {"../x": ["x"]}, 397, 30, 3650, "/CN=x")
    assert not (tmp_path / "pki").exists()


def test_cert_names_reads_a_sites_own_certificate(tmp_path):
    """What the Alertmanager preflight checks a site's own certificate (hpcobs_tls_cert_file) against."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tmp_path / "k"), "-out", str(tmp_path / "c"), "-days", "1", "-subj", "/CN=m1",
                    "-addext", "subjectAltName=DNS:m1,DNS:alertmanager-gossip.hpcobs.invalid,IP:10.0.0.1"],
                   check=True, capture_output=True)
    assert service.cert_names(str(tmp_path / "c")) == ["m1", "alertmanager-gossip.hpcobs.invalid", "10.0.0.1"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tmp_path / "k2"), "-out", str(tmp_path / "bare"), "-days", "1", "-subj", "/CN=x"],
                   check=True, capture_output=True)
    assert service.cert_names(str(tmp_path / "bare")) == []
    with pytest.raises(service.AnsibleFilterError, match="cannot read the certificate"):
        service.cert_names(str(tmp_path / "absent.crt"))
    (tmp_path / "junk").write_text("not a certificate")
    with pytest.raises(service.AnsibleFilterError, match="cannot read the certificate"):
        service.cert_names(str(tmp_path / "junk"))


def test_per_host_credentials_are_named_after_each_host_once():
    assert service.pki_host_credential("loki-push", "gpu01.cluster") == "loki-push-gpu01.cluster"
    assert service.pki_host_credentials(["loki-push", "x"], ["gpu01", "mgmt_1", "gpu01"]) == [
        "loki-push-gpu01", "loki-push-mgmt_1", "x-gpu01", "x-mgmt_1"]
    assert service.pki_host_credentials([], ["gpu01"]) == []
    for name, host, problem in [("Loki", "gpu01", "not a credential name"), ("loki-push", "../x", "cannot name"),
                                ("loki-push", "a/b", "cannot name"), ("loki-push", "..", "cannot name")]:
        with pytest.raises(service.AnsibleFilterError, match=problem):
            service.pki_host_credential(name, host)
    with pytest.raises(service.AnsibleFilterError, match="a list of names"):
        service.pki_host_credentials("loki-push", ["gpu01"])


def test_the_role_makes_the_per_host_credentials_of_every_host_and_the_reader_credential():
    import yaml
    defaults = yaml.safe_load(open(os.path.join(ROOT, "roles", "pki", "defaults", "main.yml")))
    assert defaults["pki_host_credentials"] == ["loki-push"]
    # the client credential of every TLS component whose clients use basic auth (loki-client the reader's),
    # underscores as dashes; none for the log shippers (auth: client_cert)
    assert defaults["pki_credentials"].replace(" ", "") == (
        "{{('tls'|hpcobs_components_flagged|hpcobs_basic_auth_components|hpcobs_client_credential)"
        "+['victoriametrics-admin']}}")
    made = service.client_credential(service.basic_auth_components(service.components_flagged("tls")))
    assert "loki-client" in made and "promtail-client" not in made and "alloy-client" not in made
    assert service.client_credential("node_exporter") == "node-exporter-client"
    assert service.client_credential(["dcgm_exporter", "loki"]) == ["dcgm-exporter-client", "loki-client"]
    with pytest.raises(service.AnsibleFilterError, match="not a component"):
        service.client_credential("nodeexporter")
    tasks = open(os.path.join(ROOT, "roles", "pki", "tasks", "main.yml")).read()
    assert "pki_credentials + (pki_host_credentials | hpcobs_pki_host_credentials(pki_hosts))" in tasks


def test_a_client_password_is_read_from_the_pki_or_named_missing(tmp_path):
    (tmp_path / "credentials").mkdir()
    with pytest.raises(service.AnsibleFilterError, match="run playbooks/pki.yml"):
        service.client_password("node_exporter", str(tmp_path))
    (tmp_path / "credentials" / "node-exporter-client").write_text("")
    with pytest.raises(service.AnsibleFilterError, match="is empty"):
        service.client_password("node_exporter", str(tmp_path))
    (tmp_path / "credentials" / "node-exporter-client").write_text("s3cret-s3cret-s3cret\n")
    assert service.client_password("node_exporter", str(tmp_path)) == "s3cret-s3cret-s3cret"
    with pytest.raises(service.AnsibleFilterError, match="not a component"):
        service.client_password("nodeexporter", str(tmp_path))
