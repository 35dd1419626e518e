"""Shared helpers of the logs scenario's tests (HTTP through curl inside the containers, the bundle manifest)."""
import hashlib
import json
import os
import shlex
import time
import zipfile
from pathlib import Path

import testinfra
import yaml

REPO = Path(__file__).resolve().parents[3]
MGMT = "logs-mgmt01"
NODE = "logs-gpu01"
# The scenario runs with hpcobs_security on: every client reaches Loki through its front, over HTTPS with the site
# CA and a credential; Loki itself listens on loopback of the management host (loki_backend_listen_port).
LOKI = "https://%s:3100" % MGMT
LOKI_LOCAL = "http://127.0.0.1:3101"
# On the management host: the site CA of the front, and the reader's credential as curl reads it (converge.yml).
MGMT_CA = "/etc/loki/tls/ca.crt"
READER_NETRC = "/var/lib/hpcobs-e2e/loki-reader.netrc"


def node(name):
    return testinfra.get_host("podman://%s" % name)


def pki_file(relative):
    """A file of the scenario's site PKI on the controller (roles/pki, hpcobs_pki_dir in molecule.yml)."""
    directory = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY")
    assert directory, "run through molecule verify (MOLECULE_EPHEMERAL_DIRECTORY)"
    return (Path(directory) / "pki" / relative).read_text().strip()


# The log shippers' own HTTP servers (hpcobs_security, files/components.yml auth: client_cert): HTTPS with the host's
# site certificate, and only a client presenting a certificate of the site CA. On their own host, the files of the
# shipper's TLS directory.
SHIPPER_TLS = {"promtail": "/etc/promtail/tls", "alloy": "/etc/alloy/tls"}


def shipper(host, component, path, status=False):
    """GET path of the log shipper `component` on its own host, the way its clients must: https on loopback, the
    site CA, the host's certificate and key."""
    tls = SHIPPER_TLS[component]
    port = {"promtail": 9080, "alloy": 12345}[component]
    return http(host, "https://127.0.0.1:%d%s" % (port, path), status=status, ca=tls + "/ca.crt",
                cert=(tls + "/server.crt", tls + "/server.key"))


def http(host, url, params=None, method="GET", status=False, ca=None, netrc=None, extra=(), cert=None):
    """Body of url fetched from inside host (curl); with status=True, (HTTP code, body). ca: the CA file to trust,
    netrc: a netrc file holding the credential (never on the command line), cert: (certificate, key) files of a
    client certificate."""
    args = ["curl", "-sS", "--max-time", "10", "-X", method] + list(extra)
    if ca:
        args += ["--cacert", ca]
    if cert:
        args += ["--cert", cert[0], "--key", cert[1]]
    if netrc:
        args += ["--netrc-file", netrc]
    if params:
        args.append("-G")
        for key, value in params.items():
            args += ["--data-urlencode", "%s=%s" % (key, value)]
    if status:
        args += ["-o", "/dev/stderr", "-w", "%{http_code}"]
    args.append(url)
    result = host.run(" ".join(shlex.quote(a) for a in args))
    if status:
        return int(result.stdout or 0), result.stderr
    assert result.rc == 0, "curl %s failed: %s" % (url, result.stderr)
    return result.stdout


def http_json(host, url, params=None):
    return json.loads(http(host, url, params))


def read_yaml(host, path):
    return yaml.safe_load(host.file(path).content_string)


def reader(path, params=None):
    """Body of a GET through Loki's front as the stack's reader (hpcobs_client_user, credential loki-client),
    from the management host."""
    return http(node(MGMT), LOKI + path, params, ca=MGMT_CA, netrc=READER_NETRC)


def query(host, logql, since_ns, limit=1000):  # noqa: ARG001 - the reader asks, not the node that logged
    """Streams matching a LogQL log query since since_ns, asked through Loki's front with the reader's credential
    (a GPU node holds none: it can only push)."""
    answer = json.loads(reader("/loki/api/v1/query_range",
                               {"query": logql, "start": str(since_ns), "end": str(time.time_ns() + 10 ** 9),
                                "limit": str(limit), "direction": "forward"}))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def bundle_binary_sha256(component, binary):
    """sha256 of a binary inside the bundle's amd64 archive of component, as the artifact role installs it."""
    bundle = Path(os.environ.get("HPCOBS_BUNDLE_DIR") or REPO / ".cache" / "bundle-test" / "bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())
    item = manifest["components"][component]["files"]["amd64"]
    with zipfile.ZipFile(bundle / item["path"]) as archive:
        data = archive.read(item["binaries"][binary])
    return hashlib.sha256(data).hexdigest()

