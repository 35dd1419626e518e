"""Remote write with vmagent (roles/victoriametrics victoriametrics_remote_write), unit-tested in
tests/test_vm_remote_write_filter.py and, with the real vmagent and victoria-metrics, in
tests/test_vmagent_remote_write.py.

With victoriametrics_remote_write set, vmagent (the bundle's VictoriaMetrics utilities) scrapes the role's scrape
configuration instead of VictoriaMetrics and writes every sample to the local VictoriaMetrics (vmalert and Grafana on
the host keep working) and to each configured URL (the site's VictoriaMetrics cluster, its vminsert). Secrets never
reach the command line: each URL's password or bearer token is a file on the host (0640 root:<group>), copied by the
role from a file on the controller (the site PKI's credential, or a file the site names), and vmagent is given the
file's name only.

vmagent's -remoteWrite.* flags are arrays matched by position: every flag is given once per URL, empty where a URL
does not use it, so the n-th value always belongs to the n-th URL.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

SETTING = "victoriametrics_remote_write"
KEYS = {"name", "url", "username", "password_file", "credential", "bearer_token_file", "ca_file", "site_ca"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_USER = re.compile(r"^[A-Za-z0-9_.@-]+$")
_CREDENTIAL = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)$")
# The per-URL flags, in the order they are written (each once per URL).
URL_FLAGS = ("url", "basicAuth.username", "basicAuth.passwordFile", "bearerTokenFile", "tlsCAFile")


def _text(value):
    return value if isinstance(value, str) else None


def remote_write_problems(entries):
    """What is wrong with victoriametrics_remote_write, one sentence per problem, each naming the entry and the
    setting ([] when it is right). Checked before anything on a host changes."""
    if entries is None or entries == "":
        return []
    if not isinstance(entries, (list, tuple)):
        return ["%s must be a list of {name, url, ...} (got %s)" % (SETTING, type(entries).__name__)]
    problems, names, urls = [], set(), set()
    for index, entry in enumerate(entries):
        where = "%s[%d]" % (SETTING, index)
        if not isinstance(entry, dict):
            problems.append("%s must be a map with name and url (got %r)" % (where, entry))
            continue
        name = entry.get("name")
        if isinstance(name, str) and _NAME.match(name):
            where = "%s[%d] (%s)" % (SETTING, index, name)
            if name == "local":
                problems.append("%s: the name local is the host's own VictoriaMetrics; choose another" % where)
            if name in names:
                problems.append("%s: the name is used by an earlier entry; each needs its own" % where)
            names.add(name)
        else:
            problems.append("%s: name must be lower-case letters, digits, - and _ (it names the files of the "
                            "entry's secrets on the host; got %r)" % (where, name))
        unknown = sorted(set(entry) - KEYS)
        if unknown:
            problems.append("%s: unknown key(s) %s; known: %s" % (where, ", ".join(unknown), ", ".join(sorted(KEYS))))
        problems.extend(_url_problems(where, entry.get("url"), urls))
        problems.extend(_auth_problems(where, entry))
        ca_file = entry.get("ca_file")
        if ca_file is not None and not (isinstance(ca_file, str) and ca_file.startswith("/")):
            problems.append("%s: ca_file must be an absolute path of a file on the controller (got %r)"
                            % (where, ca_file))
        if not isinstance(entry.get("site_ca", False), bool):
            problems.append("%s: site_ca must be true or false (got %r)" % (where, entry.get("site_ca")))
        if ca_file and entry.get("site_ca"):
            problems.append("%s: give ca_file or site_ca, not both" % where)
        if (ca_file or entry.get("site_ca")) and str(entry.get("url", "")).startswith("http://"):
            problems.append("%s: ca_file and site_ca are for an https:// URL" % where)
    return problems


def _url_problems(where, url, seen):
    url = _text(url)
    if not url:
        return ["%s: url is required (the site's remote-write endpoint, e.g. "
                "https://vminsert.example.org:8480/insert/0/prometheus/api/v1/write)" % where]
    if "@" in url.split("?", 1)[0].split("#", 1)[0].split("://", 1)[-1].split("/", 1)[0]:
        # never echo the URL: what stands before the @ may be a password
        return ["%s: url must not carry credentials (user:password@); give username with credential or "
                "password_file, or bearer_token_file" % where]
    if any(char.isspace() for char in url) or "," in url:
        return ["%s: url must not hold white space or a comma (got %r)" % (where, url)]
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return ["%s: url is not a valid URL (got %r)" % (where, url)]
    problems = []
    if parts.scheme not in ("http", "https"):
        problems.append("%s: url must start with http:// or https:// (got %r)" % (where, url))
    if not parts.hostname or not _HOST.match(parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc):
        problems.append("%s: url needs a host name (got %r)" % (where, url))
    if parts.query or parts.fragment:
        problems.append("%s: url must have no query or fragment (a token in a query string would end up on the "
                        "command line; use bearer_token_file)" % where)
    if url in seen:
        problems.append("%s: url is given twice" % where)
    seen.add(url)
    return problems


def _auth_problems(where, entry):
    problems = []
    username, password_file, credential = entry.get("username"), entry.get("password_file"), entry.get("credential")
    token_file = entry.get("bearer_token_file")
    if username is not None and not (isinstance(username, str) and _USER.match(username)):
        problems.append("%s: username must be letters, digits, . _ @ - (got %r)" % (where, username))
    if password_file is not None and not (isinstance(password_file, str) and password_file.startswith("/")):
        problems.append("%s: password_file must be an absolute path of a file on the controller (got %r)"
                        % (where, password_file))
    if credential is not None and not (isinstance(credential, str) and _CREDENTIAL.match(credential)):
        problems.append("%s: credential must name a credential of the site PKI (lower-case words with dashes, "
                        "<hpcobs_pki_dir>/credentials/<name>; got %r)" % (where, credential))
    if token_file is not None and not (isinstance(token_file, str) and token_file.startswith("/")):
        problems.append("%s: bearer_token_file must be an absolute path of a file on the controller (got %r)"
                        % (where, token_file))
    if password_file is not None and credential is not None:
        problems.append("%s: give password_file or credential, not both" % where)
    has_password = password_file is not None or credential is not None
    if username is not None and not has_password:
        problems.append("%s: username needs its password: credential or password_file" % where)
    if has_password and username is None:
        problems.append("%s: credential or password_file needs username" % where)
    if token_file is not None and (username is not None or has_password):
        problems.append("%s: give basic auth (username with credential or password_file) or bearer_token_file, "
                        "not both" % where)
    return problems


def remote_write_check(entries):
    """entries when they are right, else an error listing every problem (for a preflight that stops the run)."""
    problems = remote_write_problems(entries)
    if problems:
        raise AnsibleFilterError("%s is invalid: %s. Nothing was changed." % (SETTING, "; ".join(problems)))
    return entries


def remote_write_files(entries, secrets_dir, pki_dir):
    """The files of each entry's secrets and CA on the host: [{src (on the controller), dest, mode}]; a credential's
    src is <pki_dir>/credentials/<name> (pki_dir: the site PKI directory, '' | hpcobs_pki_path)."""
    remote_write_check(entries)
    out = []
    for entry in entries or []:
        base = "%s/%s" % (secrets_dir, entry["name"])
        if entry.get("credential"):
            out.append({"src": "%s/credentials/%s" % (str(pki_dir).rstrip("/"), entry["credential"]), "dest": base + ".password",
                        "mode": "0640"})
        if entry.get("password_file"):
            out.append({"src": entry["password_file"], "dest": base + ".password", "mode": "0640"})
        if entry.get("bearer_token_file"):
            out.append({"src": entry["bearer_token_file"], "dest": base + ".token", "mode": "0640"})
        if entry.get("ca_file"):
            out.append({"src": entry["ca_file"], "dest": base + ".ca.crt", "mode": "0640"})
    return out


def vmagent_remote_write_args(entries, local_url, secrets_dir, local_auth=None):
    """vmagent's -remoteWrite.* flags: the local VictoriaMetrics first (local_url: its base URL; local_auth:
    {username, password_file, ca_file} under the security switch), then every entry, each flag once per URL (empty
    where the URL does not use it). File names only: never a secret."""
    remote_write_check(entries)
    local_auth = local_auth or {}
    rows = [{"url": str(local_url).rstrip("/") + "/api/v1/write",
             "basicAuth.username": local_auth.get("username", ""),
             "basicAuth.passwordFile": local_auth.get("password_file", ""),
             "bearerTokenFile": "",
             "tlsCAFile": local_auth.get("ca_file", "")}]
    for entry in entries or []:
        base = "%s/%s" % (secrets_dir, entry["name"])
        has_password = entry.get("credential") or entry.get("password_file")
        ca = ""
        if entry.get("ca_file"):
            ca = base + ".ca.crt"
        elif entry.get("site_ca"):
            ca = local_auth.get("ca_file", "")
            if not ca:
                raise AnsibleFilterError("%s (%s): site_ca needs the site CA, which the host has only with the "
                                         "security switch on (hpcobs_security); give ca_file" % (SETTING, entry["name"]))
        rows.append({"url": entry["url"],
                     "basicAuth.username": entry.get("username", "") if has_password else "",
                     "basicAuth.passwordFile": base + ".password" if has_password else "",
                     "bearerTokenFile": base + ".token" if entry.get("bearer_token_file") else "",
                     "tlsCAFile": ca})
    args = []
    for flag in URL_FLAGS:
        # a flag no URL uses is left out altogether
        if any(row[flag] for row in rows):
            args.extend("-remoteWrite.%s=%s" % (flag, row[flag]) for row in rows)
    return args


class FilterModule:
    def filters(self):
        return {
            "hpcobs_vm_remote_write_problems": remote_write_problems,
            "hpcobs_vm_remote_write_check": remote_write_check,
            "hpcobs_vm_remote_write_files": remote_write_files,
            "hpcobs_vmagent_remote_write_args": vmagent_remote_write_args,
        }
