"""The log shippers' own HTTP servers under hpcobs_security (files/components.yml auth: client_cert): Promtail :9080
on logs-gpu01, Alloy :12345 on logs-gpu02. Neither takes basic auth on its own server, so each serves HTTPS with its
host's site certificate and REQUIRES a client certificate of the site CA: a job on another node (or on the same one:
the host key is root:<service group> 0640) cannot read the shipper's metrics, configuration or targets.

Each is asked from the other GPU node: without a client certificate the handshake fails, plain HTTP is refused, a
certificate of another CA fails the handshake; the asking node's own site certificate gets 200.
"""
import shlex
import subprocess

import pytest

from helpers import NODE, SHIPPER_TLS, http, node

ALLOY_NODE = "logs-gpu02"
# (shipper, its host, its port, the paths a job would read: metrics, readiness, configuration and targets)
SERVERS = [
    ("promtail", NODE, 9080, ["/metrics", "/ready", "/config"]),
    ("alloy", ALLOY_NODE, 12345, ["/metrics", "/-/ready"]),
]
CASES = [(name, server, port, path) for name, server, port, paths in SERVERS for path in paths]
OTHER_CA = "/root/hpcobs-test-other-ca"


def asker(server):
    """The other GPU node, and its shipper's TLS directory (its own site certificate and key, the site CA)."""
    return (ALLOY_NODE, SHIPPER_TLS["alloy"]) if server == NODE else (NODE, SHIPPER_TLS["promtail"])


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A CA that is not the site's, and a client certificate it signed (serverAuth+clientAuth, like a site one),
    made on the controller with openssl and copied to both GPU nodes."""
    work = tmp_path_factory.mktemp("other-ca")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=not the site CA", "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=intruder",
            "-keyout", "client.key", "-out", "client.csr")
    (work / "ext").write_text("extendedKeyUsage = serverAuth, clientAuth\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "ext", "-out", "client.crt")
    for name in (NODE, ALLOY_NODE):
        host = node(name)
        host.check_output("install -d -m 0700 %s" % OTHER_CA)
        for item in ("client.crt", "client.key"):
            host.check_output("umask 077; printf %%s %s > %s/%s" % (
                shlex.quote((work / item).read_text()), OTHER_CA, item))
    yield OTHER_CA
    for name in (NODE, ALLOY_NODE):
        node(name).check_output("rm -rf %s" % OTHER_CA)


@pytest.mark.parametrize("name,server,port,path", CASES)
def test_without_a_client_certificate_the_handshake_fails(name, server, port, path):
    client, tls = asker(server)
    code, error = http(node(client), "https://%s:%d%s" % (server, port, path), status=True, ca=tls + "/ca.crt")
    assert code == 0, (name, path, code, error)


@pytest.mark.parametrize("name,server,port,path", CASES)
def test_plain_http_is_refused(name, server, port, path):
    client, _ = asker(server)
    code, body = http(node(client), "http://%s:%d%s" % (server, port, path), status=True)
    assert code in (0, 400), (name, path, code, body)
    assert "build_info" not in body and "scrape_configs" not in body and "Ready" not in body


@pytest.mark.parametrize("name,server,port,path", CASES)
def test_a_certificate_of_another_ca_is_refused(other_ca, name, server, port, path):
    client, tls = asker(server)
    code, error = http(node(client), "https://%s:%d%s" % (server, port, path), status=True, ca=tls + "/ca.crt",
                       cert=(other_ca + "/client.crt", other_ca + "/client.key"))
    assert code == 0, (name, path, code, error)


@pytest.mark.parametrize("name,server,port,path", CASES)
def test_the_site_certificate_of_another_node_gets_200(name, server, port, path):
    client, tls = asker(server)
    code, body = http(node(client), "https://%s:%d%s" % (server, port, path), status=True, ca=tls + "/ca.crt",
                      cert=(tls + "/server.crt", tls + "/server.key"))
    assert code == 200, (name, path, code, body)
    if path == "/metrics":
        assert "%s_build_info" % name in body


@pytest.mark.parametrize("name,server", [(name, server) for name, server, _, _ in SERVERS])
def test_the_tls_files_and_their_modes(name, server):
    host, tls = node(server), SHIPPER_TLS[name]
    directory = host.file(tls)
    assert directory.is_directory and (directory.user, directory.group, directory.mode) == ("root", name, 0o750)
    for item, mode in (("ca.crt", 0o644), ("server.crt", 0o644), ("server.key", 0o640)):
        f = host.file("%s/%s" % (tls, item))
        assert (f.user, f.group, f.mode) == ("root", name, mode), item
    # no basic-auth credential of its own (auth: client_cert): only the push credential is there
    assert not host.file("%s/%s-client" % (tls, name)).exists
    # a user job cannot take the host's key to present it
    result = host.run("runuser -u nobody -- cat %s/server.key" % tls)
    assert result.rc != 0 and "BEGIN" not in result.stdout
