"""The GPU node's exporter under the site's security switch (hpcobs_security on for one host of molecule.yml): the
GPU simulator, run by the dcgm_exporter role with --web-config-file as dcgm-exporter would be, serves HTTPS with the
host's certificate from the site PKI and basic auth of the client user. Without the credential, with a wrong one, or
without trusting the site CA nothing is served; with them the DCGM metrics and the job mapping are. The host with
the switch off keeps plain HTTP and has no TLS files."""
import re

import pytest
import testinfra

from gpu_node_lib import (CLIENT_USER, EXPECTED, EXPORTER, MAPPING_DIR, SECURE_EXPORTER, SECURED, TLS_DIR, WEB_CONFIG,
                          client_password, fetch, parse, series, whole_gpu_index)

CA = TLS_DIR + "/ca.crt"


# The switch is on for the hosts of SECURED only: the secured tests run on those, the plain one on the others.
PLAIN = sorted(set(EXPECTED) - SECURED)


@pytest.fixture(scope="module", params=sorted(SECURED))
def secured_host(request):
    return testinfra.get_host("podman://%s" % request.param)


@pytest.fixture(scope="module", params=PLAIN)
def plain_host(request):
    return testinfra.get_host("podman://%s" % request.param)


def test_the_scenario_has_a_secured_and_a_plain_host():
    assert SECURED and PLAIN and SECURED <= set(EXPECTED)


def test_without_credentials_the_exporter_answers_401_with_a_basic_challenge(secured_host):
    for path in ("/metrics", "/health", "/"):
        status, challenge, body = fetch(secured_host, SECURE_EXPORTER + path, CA)
        # (the shell strips the trailing newline of "Unauthorized\n")
        assert (status, challenge, body.strip()) == (401, "Basic", "Unauthorized"), path


def test_a_wrong_password_or_user_answers_401(secured_host):
    password = client_password()
    for user, wrong in ((CLIENT_USER, password[:-1]), (CLIENT_USER, password + "x"), (CLIENT_USER, ""),
                        ("root", password)):
        status, challenge, body = fetch(secured_host, SECURE_EXPORTER + "/metrics", CA, user, wrong)
        assert (status, challenge) == (401, "Basic"), user
        assert "DCGM_FI_" not in body


def test_a_client_not_trusting_the_site_ca_fails_the_handshake(secured_host):
    # the system's trust store only: the site CA is not in it
    status, _, body = fetch(secured_host, SECURE_EXPORTER + "/metrics", "-", CLIENT_USER, client_password())
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body
    # plain HTTP gets no metrics either (the port speaks TLS only)
    status, _, body = fetch(secured_host, EXPORTER + "/metrics", "none", CLIENT_USER, client_password())
    assert status in (0, 400) and "DCGM_FI_" not in body, body


def test_the_site_ca_and_the_credential_get_the_dcgm_metrics_and_the_job_mapping(secured_host):
    status, _, body = fetch(secured_host, SECURE_EXPORTER + "/metrics", CA, CLIENT_USER, client_password())
    assert status == 200
    samples, meta = parse(body)
    assert "DCGM_FI_DEV_GPU_TEMP" in meta and series(samples, "DCGM_FI_DEV_GPU_TEMP")
    assert all(name.startswith("DCGM_FI_") for name in meta)
    status, _, body = fetch(secured_host, SECURE_EXPORTER + "/health", CA, CLIENT_USER, client_password())
    assert (status, body) == (200, "OK")
    gpu = whole_gpu_index(secured_host)
    path = "%s/%d" % (MAPPING_DIR, gpu)
    try:
        secured_host.check_output("echo 8080 > %s" % path)
        _, _, body = fetch(secured_host, SECURE_EXPORTER + "/metrics", CA, CLIENT_USER, client_password())
        samples, _ = parse(body)
        assert {s.d.get("hpc_job") for s in series(samples, "DCGM_FI_DEV_GPU_TEMP", gpu)} == {"8080"}
        assert all("hpc_job" not in s.d for s in samples if s.d["gpu"] != str(gpu))
    finally:
        secured_host.run("rm -f %s" % path)


def test_tls_files_and_web_config_modes(secured_host):
    directory = secured_host.file(TLS_DIR)
    assert directory.is_directory and (directory.user, directory.group, directory.mode) == (
        "root", "dcgm_exporter", 0o750)
    for name, mode in (("ca.crt", 0o644), ("server.crt", 0o644), ("server.key", 0o640)):
        f = secured_host.file("%s/%s" % (TLS_DIR, name))
        assert f.is_file and (f.user, f.group, f.mode) == ("root", "dcgm_exporter", mode), name
    web = secured_host.file(WEB_CONFIG)
    assert (web.user, web.group, web.mode) == ("root", "dcgm_exporter", 0o640)
    text = web.content_string
    # exporter-toolkit's format: the host's certificate, the one user with the bcrypt hash of the credential only
    assert "cert_file: %s/server.crt" % TLS_DIR in text and "key_file: %s/server.key" % TLS_DIR in text
    assert "min_version: TLS12" in text
    assert re.search(r"(?m)^  %s: \$2[aby]\$10\$[./A-Za-z0-9]{53}$" % CLIENT_USER, text), text
    assert client_password() not in text
    # no secret on the command line or in the unit
    unit = secured_host.file("/etc/systemd/system/dcgm_exporter.service").content_string
    assert client_password() not in unit and "--web-config-file" in unit
    # the simulator checks the hash with bcrypt and reads the YAML with PyYAML, which the lab role installed
    for package in ("python3-bcrypt", "python3-yaml"):
        assert secured_host.package(package).is_installed, package


def test_plain_host_serves_http_without_tls_files(plain_host):
    host = plain_host
    status, challenge, body = fetch(host, EXPORTER + "/metrics")
    assert status == 200 and challenge == "" and "DCGM_FI_DEV_GPU_TEMP" in body
    assert not host.file(TLS_DIR).exists and not host.file(WEB_CONFIG).exists
    assert "--web-config-file" not in host.file("/etc/systemd/system/dcgm_exporter.service").content_string
    # nothing beyond the standard library was needed: python3-bcrypt was not installed for it
    assert not host.package("python3-bcrypt").is_installed
