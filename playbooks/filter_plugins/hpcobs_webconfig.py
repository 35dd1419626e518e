"""The web configuration file of the programs built on the Prometheus exporter-toolkit (Alertmanager, node_exporter,
ipmi_exporter, smartctl_exporter, dcgm-exporter: their --web.config.file), made once for all of them, and
Alertmanager's gossip TLS file (--cluster.tls-config), whose server half is the same exporter-toolkit block.

Keys as exporter-toolkit reads them (prometheus/exporter-toolkit web/tls_config.go, docs/web-configuration.md):
tls_server_config {cert_file, key_file, min_version, client_auth_type, client_ca_file, client_allowed_sans} and
basic_auth_users {user: bcrypt hash}; the client half of the gossip file is prometheus/common's TLS config
{ca_file, cert_file, key_file, server_name, min_version} (alertmanager cluster/tls_config.go).

The bcrypt hash is made on the controller with a salt derived from the password and a fixed label, so that the same
password gives the same file on every run (idempotent) and a new password a new hash. Pure functions, unit-tested in
tests/test_webconfig.py.
"""

import base64
import hashlib
import hmac
import re

import yaml

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

# exporter-toolkit's tls_server_config.min_version values (web/tls_config.go tlsVersions)
TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")
# crypto/tls ClientAuthType names exporter-toolkit accepts for client_auth_type
CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
# Cost of the bcrypt hashes: exporter-toolkit checks the hash of every request (it caches a success), so a cost
# well below the one of interactive logins keeps scrapes and API calls cheap; the passwords are random (roles/pki).
BCRYPT_COST = 10
# bcrypt's own base64 alphabet (OpenBSD bcrypt), bit-for-bit the standard encoding with other characters
_STANDARD = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_BCRYPT = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_TO_BCRYPT = str.maketrans(_STANDARD, _BCRYPT)
_USER = re.compile(r"^[A-Za-z0-9_.-]+$")
_DNS_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


def _bcrypt():
    try:
        import bcrypt
    except ImportError:
        raise AnsibleFilterError("the Python package bcrypt is missing on the controller: install requirements.txt "
                                 "(make setup, or pip install -r requirements.txt)")
    return bcrypt


def bcrypt_salt(password, label, cost=BCRYPT_COST):
    """The bcrypt salt ($2b$<cost>$ and 22 characters) of a password: HMAC-SHA256 of the password keyed with the
    label, its first 16 bytes in bcrypt's base64 (the same password and label always give the same salt)."""
    if not str(label):
        raise AnsibleFilterError("a bcrypt salt needs a label (what the password is for)")
    if not isinstance(cost, int) or isinstance(cost, bool) or not 4 <= cost <= 31:
        raise AnsibleFilterError("bcrypt cost must be 4-31, not %r" % (cost,))
    digest = hmac.new(str(label).encode(), str(password).encode(), hashlib.sha256).digest()[:16]
    return "$2b$%02d$%s" % (cost, base64.b64encode(digest).decode()[:22].translate(_TO_BCRYPT))


def bcrypt_hash(password, label, cost=BCRYPT_COST):
    """bcrypt hash of a password, deterministic for the same password and label (bcrypt_salt)."""
    password = str(password)
    if not password:
        raise AnsibleFilterError("cannot hash an empty password")
    if len(password.encode()) > 72:
        raise AnsibleFilterError("bcrypt takes passwords of at most 72 bytes (got %d)" % len(password.encode()))
    return _bcrypt().hashpw(password.encode(), bcrypt_salt(password, label, cost).encode()).decode()


def _check_tls_dir(tls_dir):
    tls_dir = "%s" % (tls_dir or "")
    if not tls_dir.startswith("/") or re.search(r"\s", tls_dir):
        raise AnsibleFilterError("the TLS directory must be an absolute path without blanks, not %r" % (tls_dir,))
    return tls_dir.rstrip("/")


def _check_min_version(min_version):
    if min_version not in TLS_VERSIONS:
        raise AnsibleFilterError("min_version must be one of %s, not %r" % (", ".join(TLS_VERSIONS), min_version))
    return TLS_VERSIONS[TLS_VERSIONS.index(min_version)]  # the plain string (YAML dumps no templated one)


def tls_server_config(tls_dir, min_version="TLS12", client_auth_type="", client_allowed_sans=None):
    """exporter-toolkit's tls_server_config of a host's certificate in tls_dir (server.crt, server.key; ca.crt for
    client certificates when client_auth_type asks for them), as a dict."""
    tls_dir = _check_tls_dir(tls_dir)
    config = {"cert_file": tls_dir + "/server.crt", "key_file": tls_dir + "/server.key",
              "min_version": _check_min_version(min_version)}
    if client_auth_type:
        if client_auth_type not in CLIENT_AUTH_TYPES:
            raise AnsibleFilterError("client_auth_type must be one of %s, not %r"
                                     % (", ".join(CLIENT_AUTH_TYPES), client_auth_type))
        config.update(client_auth_type=CLIENT_AUTH_TYPES[CLIENT_AUTH_TYPES.index(client_auth_type)],
                      client_ca_file=tls_dir + "/ca.crt")
    if client_allowed_sans:
        if not client_auth_type or client_auth_type == "NoClientCert":
            raise AnsibleFilterError("client_allowed_sans needs a client_auth_type that asks for a certificate")
        config["client_allowed_sans"] = [str(name) for name in client_allowed_sans]
    return config


def web_config(tls_dir, user, password, label, min_version="TLS12", client_auth_type=""):
    """YAML of a --web.config.file: HTTPS with the host's certificate in tls_dir, HTTP basic auth of one user whose
    password is hashed with bcrypt (bcrypt_hash(password, label))."""
    user = str(user or "")
    if not _USER.match(user):
        raise AnsibleFilterError("basic auth user %r: letters, digits, . _ - only" % (user,))
    config = {"tls_server_config": tls_server_config(tls_dir, min_version, client_auth_type),
              "basic_auth_users": {user: bcrypt_hash(password, label)}}
    return yaml.safe_dump(config, default_flow_style=False, sort_keys=False)


def cluster_tls_config(tls_dir, server_name, min_version="TLS12"):
    """YAML of Alertmanager's --cluster.tls-config: mutual TLS between the peers, each presenting the host's
    certificate of tls_dir and trusting the site CA only. Peers dial each other by IP address; each certificate
    also carries server_name, which the client verifies and the server requires of a client certificate."""
    server_name = str(server_name or "")
    if not _DNS_NAME.match(server_name):
        raise AnsibleFilterError("the gossip TLS name must be a DNS name, not %r" % (server_name,))
    tls_dir = _check_tls_dir(tls_dir)
    config = {
        "tls_server_config": tls_server_config(tls_dir, min_version, "RequireAndVerifyClientCert", [server_name]),
        "tls_client_config": {"ca_file": tls_dir + "/ca.crt", "cert_file": tls_dir + "/server.crt",
                              "key_file": tls_dir + "/server.key", "server_name": server_name,
                              "min_version": _check_min_version(min_version)}}
    return yaml.safe_dump(config, default_flow_style=False, sort_keys=False)


class FilterModule:
    def filters(self):
        return {
            "hpcobs_bcrypt": bcrypt_hash,
            "hpcobs_cluster_tls_config": cluster_tls_config,
            "hpcobs_web_config": web_config,
        }
