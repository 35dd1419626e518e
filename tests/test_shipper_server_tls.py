"""The log shippers' own HTTP servers under hpcobs_security, in the stand-ins (molecule/standins/promtail, alloy) and
in what the alloy role writes: HTTPS with the host's certificate, a client certificate of the site CA required
(RequireAndVerifyClientCert), as Promtail 3.6.15 (dskit server http_tls_config, exporter-toolkit web.TLSConfig) and
Alloy 1.18 (http { tls { ... } }) serve it; and the settings the real programs refuse."""
from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import urllib.request

import pytest
import yaml

from test_alloy import ALLOY, plugin, settings
from test_loki_standin import PROMTAIL, _ca_and_server_cert, free_port, load
from test_promtail_standin import DENIED_JOURNALCTL, config_for

load(PROMTAIL, "hpcobs_promtail_standin_tls")  # puts the stand-ins' shared module on the path
standin = sys.modules["standin"]


@pytest.fixture
def pki(tmp_path):
    """The site CA with a certificate for 127.0.0.1 (the server's, and the client's: site certificates carry
    serverAuth and clientAuth), and another CA with one of its own."""
    site = _ca_and_server_cert(tmp_path / "site", "site CA")
    other = _ca_and_server_cert(tmp_path / "other", "another CA")
    return site, other


def get(url, ca, cert=None):
    """(status, body) of a GET over HTTPS trusting ca, presenting cert (certificate, key) if given; OSError when the
    handshake fails."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    with urllib.request.urlopen(url, timeout=10, context=context) as answer:
        body = answer.read().decode()
    return answer.status, body


def wait_tls(url, ca, cert, proc, timeout=15):
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the stand-in exited"
        try:
            return get(url, ca, cert)
        except OSError:
            time.sleep(0.2)
    pytest.fail("%s never answered" % url)


def refused(url, ca, cert=None):
    """True when the server refuses the request at the handshake (or right after it: TLS 1.3 sends the alert for a
    missing client certificate after the client's Finished, with the first read)."""
    try:
        get(url, ca, cert)
    except (OSError, ssl.SSLError):
        return True
    return False


def plain(port, path):
    import http.client
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path)
    answer = connection.getresponse()
    return answer.status, answer.read().decode()


def check_mutual_tls(port, path, site, other, proc):
    ca, cert, key = site
    url = "https://127.0.0.1:%d%s" % (port, path)
    assert wait_tls(url, ca, (cert, key), proc)[0] == 200
    assert refused(url, ca)  # no client certificate
    assert refused(url, ca, (other[1], other[2]))  # a certificate of another CA
    status, body = plain(port, path)
    assert status == 400 and "HTTPS server" in body


def promtail_config(tmp_path, port, site, **tls):
    config = config_for("http://127.0.0.1:9", tmp_path, port)
    ca, cert, key = site
    config["server"]["http_tls_config"] = dict({"cert_file": str(cert), "key_file": str(key),
                                                "client_auth_type": "RequireAndVerifyClientCert",
                                                "client_ca_file": str(ca)}, **tls)
    config["server"]["tls_min_version"] = "VersionTLS12"
    path = tmp_path / "promtail.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def journal_bin(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "journalctl").write_text(DENIED_JOURNALCTL)
    (bin_dir / "journalctl").chmod(0o755)
    return {"PATH": "%s:/usr/bin:/bin" % bin_dir}


def test_promtail_serves_https_and_requires_a_site_client_certificate(tmp_path, pki):
    site, other = pki
    port = free_port()
    path = promtail_config(tmp_path, port, site)
    check = subprocess.run([sys.executable, str(PROMTAIL), "-config.file=%s" % path, "-check-syntax"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([sys.executable, str(PROMTAIL), "-config.file=%s" % path], env=journal_bin(tmp_path),
                            stderr=subprocess.DEVNULL)
    try:
        check_mutual_tls(port, "/metrics", site, other, proc)
        status, body = get("https://127.0.0.1:%d/config" % port, site[0], site[1:])
        assert status == 200 and "scrape_configs" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


@pytest.mark.parametrize("server,message", [
    ({"http_tls_config": {"client_auth_type": "RequireAndVerifyClientCerts"}}, 'invalid ClientAuth'),
    ({"http_tls_config": {"client_auth_type": "NoClientCert"}}, "without a Client Auth Policy"),
    ({"tls_min_version": "TLS12"}, "unknown TLS version"),
])
def test_promtail_refuses_to_start_with_bad_server_tls(tmp_path, pki, server, message):
    port = free_port()
    path = promtail_config(tmp_path, port, pki[0], **server.get("http_tls_config", {}))
    if "tls_min_version" in server:
        config = yaml.safe_load(path.read_text())
        config["server"]["tls_min_version"] = server["tls_min_version"]
        path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, str(PROMTAIL), "-config.file=%s" % path], env=journal_bin(tmp_path),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def alloy_settings(site, tmp_path):
    ca, cert, key = site
    return settings(journal_enabled=False, file_targets=[{"job": "slurm", "paths": [str(tmp_path / "*.log")]}],
                    loki_urls=["http://127.0.0.1:9"], server_tls=True, server_cert_file=str(cert),
                    server_key_file=str(key), server_client_ca_file=str(ca))


def test_the_role_writes_alloys_http_tls_block_only_under_the_switch(tmp_path, pki):
    text = plugin.alloy_config(alloy_settings(pki[0], tmp_path))
    ca, cert, key = pki[0]
    assert ('http {\n  tls {\n    cert_file = "%s"\n    key_file = "%s"\n    client_ca_file = "%s"\n'
            '    client_auth_type = "RequireAndVerifyClientCert"\n    min_version = "TLS12"\n  }\n}' % (cert, key, ca)
            ) in text
    assert "http {" not in plugin.alloy_config(settings())
    assert "http {" not in plugin.alloy_config(dict(alloy_settings(pki[0], tmp_path), server_tls=False))


def test_alloy_serves_https_and_requires_a_site_client_certificate(tmp_path, pki):
    site, other = pki
    port = free_port()
    path = tmp_path / "config.alloy"
    path.write_text(plugin.alloy_config(alloy_settings(site, tmp_path)))
    assert subprocess.run([str(ALLOY), "validate", str(path)], capture_output=True).returncode == 0
    proc = subprocess.Popen([str(ALLOY), "run", "--server.http.listen-addr=127.0.0.1:%d" % port,
                             "--storage.path=%s" % (tmp_path / "data"), str(path)], stderr=subprocess.DEVNULL)
    try:
        check_mutual_tls(port, "/-/ready", site, other, proc)
        status, body = get("https://127.0.0.1:%d/metrics" % port, site[0], site[1:])
        assert status == 200 and "alloy_build_info" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


@pytest.mark.parametrize("change,message", [
    (lambda t: t.replace('"RequireAndVerifyClientCert"', '"RequireClientCert"'), 'unknown client_auth_type'),
    (lambda t: t.replace('"RequireAndVerifyClientCert"', '"NoClientCert"'), "a client CA needs a client_auth_type"),
    (lambda t: t.replace('"TLS12"', '"VersionTLS12"'), "unrecognized TLS version"),
    (lambda t: "\n".join(line for line in t.splitlines() if "key_file" not in line), "and a key"),
    (lambda t: t.replace("    min_version", '    cert_pem = "x"\n    min_version'), "mutually exclusive"),
    (lambda t: t.replace("    min_version", '    client_ca = "x"\n    min_version'),
     'unrecognized attribute name "client_ca"'),
])
def test_alloy_refuses_bad_http_tls(tmp_path, pki, change, message):
    path = tmp_path / "config.alloy"
    path.write_text(change(plugin.alloy_config(alloy_settings(pki[0], tmp_path))))
    result = subprocess.run([str(ALLOY), "validate", str(path)], capture_output=True, text=True)
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_server_tls_takes_go_client_auth_names():
    with pytest.raises(ValueError, match="invalid ClientAuth"):
        standin.server_tls("c", "k", "require")
    with pytest.raises(ValueError, match="not implemented by the stand-in"):
        standin.server_tls("c", "k", "RequireAnyClientCert")
