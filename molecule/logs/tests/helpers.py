"""Shared helpers of the logs scenario's tests (HTTP through curl inside the containers, the bundle manifest)."""
import hashlib
import json
import os
import shlex
import time
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
MGMT = "logs-mgmt01"
NODE = "logs-gpu01"
LOKI = "http://%s:3100" % MGMT


def http(host, url, params=None, method="GET", status=False):
    """Body of url fetched from inside host (curl); with status=True, (HTTP code, body)."""
    args = ["curl", "-sS", "--max-time", "10", "-X", method]
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


def query(host, logql, since_ns, limit=1000):
    """Streams matching a LogQL log query since since_ns, asked from host over the test network."""
    answer = http_json(host, LOKI + "/loki/api/v1/query_range",
                       {"query": logql, "start": str(since_ns), "end": str(time.time_ns() + 10 ** 9),
                        "limit": str(limit), "direction": "forward"})
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

