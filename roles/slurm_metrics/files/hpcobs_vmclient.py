"""How hpcobs-jobstats and hpcobs-report reach VictoriaMetrics: the settings of /etc/hpcobs/jobstats.conf (written by
the slurm_metrics role) and one GET that honours them. Installed beside the tools (their directory is first on
sys.path when they run).

jobstats.conf, `key = value` lines (# comments):
    url            VictoriaMetrics (with the site's security switch on: its read-only front, https://<mgmt>:8427)
    ca_file        the site CA that the https URL's certificate must chain to (empty: the system's CAs)
    user           HTTP basic auth user (empty: none)
    password_file  the file holding that user's password (read at each run; never on the command line)
$HPCOBS_VM_URL overrides url; $HPCOBS_JOBSTATS_CONF names another settings file.
"""

from __future__ import annotations

import base64
import os
import ssl
import urllib.parse
import urllib.request

CONFIG = "/etc/hpcobs/jobstats.conf"
DEFAULT_URL = "http://127.0.0.1:8428"
KEYS = ("url", "ca_file", "user", "password_file", "mailer", "summary_delay", "summary_timeout")


def settings(path=None):
    """The settings file as a dict (missing file: no settings); $HPCOBS_VM_URL overrides its url."""
    path = path or os.environ.get("HPCOBS_JOBSTATS_CONF") or CONFIG
    values = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if not line or line.startswith("#") or "=" not in line:
                    continue
                key, _, value = line.partition("=")
                if key.strip() in KEYS:
                    values[key.strip()] = value.strip()
    except FileNotFoundError:
        pass
    if os.environ.get("HPCOBS_VM_URL"):
        values["url"] = os.environ["HPCOBS_VM_URL"]
    return values


def default_url(config=None):
    return (settings() if config is None else config).get("url") or DEFAULT_URL


def _password(config):
    path = config.get("password_file", "")
    if not path:
        raise OSError("user %s is set in %s, but no password_file" % (config.get("user"), CONFIG))
    with open(path, encoding="utf-8") as handle:
        password = handle.read().strip()
    if not password:
        raise OSError("the password file %s is empty" % path)
    return password


def get(url, path, params, timeout, config=None):
    """The body of GET <url><path>?<params>, with the CA and credentials of the settings when they name them.
    Raises urllib.error.URLError / OSError (an unreadable password file, a refused certificate, HTTP 401)."""
    config = settings() if config is None else config
    request = urllib.request.Request("%s%s?%s" % (url.rstrip("/"), path, urllib.parse.urlencode(params, doseq=True)))
    if config.get("user"):
        token = base64.b64encode(("%s:%s" % (config["user"], _password(config))).encode()).decode()
        request.add_header("Authorization", "Basic " + token)
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=config.get("ca_file") or None)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
        return answer.read()
