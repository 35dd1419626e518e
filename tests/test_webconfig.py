"""The exporter-toolkit web configuration and Alertmanager's gossip TLS file (playbooks/filter_plugins/
hpcobs_webconfig.py): the bcrypt hash verifies with bcrypt, the same password gives the same file (idempotent runs),
another password another hash, and bad input is refused before anything is written."""
import importlib.util
import os

import bcrypt
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "hpcobs_webconfig", os.path.join(ROOT, "playbooks", "filter_plugins", "hpcobs_webconfig.py"))
webconfig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(webconfig)

PASSWORD = "Zq3kV9xR2mLp7TnW4sYb8HcJ1fGd6AeU0oIiKlMn"  # shaped like a credential of roles/pki (40 letters and digits)


def test_the_hash_verifies_with_bcrypt_and_a_wrong_password_does_not():
    hashed = webconfig.bcrypt_hash(PASSWORD, "alertmanager-client")
    assert hashed.startswith("$2b$10$") and len(hashed) == 60
    assert bcrypt.checkpw(PASSWORD.encode(), hashed.encode())
    assert not bcrypt.checkpw(b"not-the-password", hashed.encode())
    assert not bcrypt.checkpw(PASSWORD[:-1].encode(), hashed.encode())


def test_same_password_same_hash_another_password_or_label_another():
    first = webconfig.bcrypt_hash(PASSWORD, "alertmanager-client")
    assert webconfig.bcrypt_hash(PASSWORD, "alertmanager-client") == first
    assert webconfig.bcrypt_hash(PASSWORD + "x", "alertmanager-client") != first
    assert webconfig.bcrypt_hash(PASSWORD, "node_exporter-client") != first
    # the salt depends on the password: two passwords never share one
    assert webconfig.bcrypt_salt("a", "l") != webconfig.bcrypt_salt("b", "l")
    assert len(webconfig.bcrypt_salt("a", "l")) == len("$2b$10$") + 22


def test_web_config_holds_tls_and_one_user_with_a_hash_never_the_password():
    text = webconfig.web_config("/etc/alertmanager/tls/", "hpcobs", PASSWORD, "alertmanager-client")
    assert PASSWORD not in text
    config = yaml.safe_load(text)
    assert config["tls_server_config"] == {"cert_file": "/etc/alertmanager/tls/server.crt",
                                           "key_file": "/etc/alertmanager/tls/server.key", "min_version": "TLS12"}
    assert list(config["basic_auth_users"]) == ["hpcobs"]
    assert bcrypt.checkpw(PASSWORD.encode(), config["basic_auth_users"]["hpcobs"].encode())
    assert webconfig.web_config("/etc/alertmanager/tls", "hpcobs", PASSWORD, "alertmanager-client") == text
    mutual = yaml.safe_load(webconfig.web_config("/t", "u", "p", "l", "TLS13", "RequireAndVerifyClientCert"))
    assert mutual["tls_server_config"]["client_ca_file"] == "/t/ca.crt"
    assert mutual["tls_server_config"]["min_version"] == "TLS13"


def test_cluster_tls_config_is_mutual_and_checks_the_peer_name():
    config = yaml.safe_load(webconfig.cluster_tls_config("/etc/alertmanager/tls", "am-gossip.site.invalid"))
    server, client = config["tls_server_config"], config["tls_client_config"]
    assert server["client_auth_type"] == "RequireAndVerifyClientCert"
    assert server["client_ca_file"] == client["ca_file"] == "/etc/alertmanager/tls/ca.crt"
    assert server["client_allowed_sans"] == ["am-gossip.site.invalid"]
    assert (client["cert_file"], client["key_file"]) == (server["cert_file"], server["key_file"])
    assert client["server_name"] == "am-gossip.site.invalid"


@pytest.mark.parametrize("call,message", [
    (lambda: webconfig.web_config("relative/tls", "hpcobs", "p", "l"), "absolute path"),
    (lambda: webconfig.web_config("/tls", "hp:cobs", "p", "l"), "letters, digits"),
    (lambda: webconfig.web_config("/tls", "hpcobs", "", "l"), "empty password"),
    (lambda: webconfig.web_config("/tls", "hpcobs", "x" * 73, "l"), "at most 72 bytes"),
    (lambda: webconfig.web_config("/tls", "hpcobs", "p", "l", "TLS14"), "min_version"),
    (lambda: webconfig.web_config("/tls", "hpcobs", "p", "l", client_auth_type="Always"), "client_auth_type"),
    (lambda: webconfig.bcrypt_hash("p", ""), "needs a label"),
    (lambda: webconfig.bcrypt_hash("p", "l", cost=3), "cost"),
    (lambda: webconfig.cluster_tls_config("/tls", "not a name"), "DNS name"),
    (lambda: webconfig.tls_server_config("/tls", client_allowed_sans=["x"]), "client_allowed_sans"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(webconfig.AnsibleFilterError, match=message):
        call()
