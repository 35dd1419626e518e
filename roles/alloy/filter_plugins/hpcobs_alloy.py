"""Filters of the alloy role: its configuration in Alloy's syntax, built from data (`alloy_config`), and the
checks of its inputs (`alloy_problems`).

The configuration carries the project's log label contract exactly as roles/promtail does, from the same globals:
the journal (kernel lines included: nothing is filtered on transport) through loki.relabel rules that map journal
fields to the contract's labels, file targets with `job` and `filename`, and one loki.write endpoint per Loki with
`node` (and the external labels) on every stream, the tenant and, optionally, basic-auth credentials whose password
is read from a file (never written into the configuration). With `server_tls`, the `http` block's `tls` serves
Alloy's own HTTP server over HTTPS and requires a client certificate of the site CA (RequireAndVerifyClientCert).

Components and arguments are those of Grafana Alloy 1.18 (loki.source.journal, loki.relabel, local.file_match,
loki.source.file, loki.write; docs/sources/reference/components of grafana/alloy; the http block:
docs/sources/reference/config-blocks/http.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used outside Ansible (unit tests)
    AnsibleFilterError = ValueError

# The checks shared with other roles live beside the playbooks, on every play's filter path.
SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir,
                      "playbooks", "filter_plugins", "hpcobs_checks.py")


def _checks():
    """The shared checks module (playbooks/filter_plugins/hpcobs_checks.py), loaded once."""
    module = sys.modules.get("hpcobs_checks_shared")
    if module is None:
        if not os.path.isfile(SHARED):
            raise AnsibleFilterError("alloy: %s is missing; the roles need the project's playbooks directory beside "
                                     "them" % os.path.normpath(SHARED))
        spec = importlib.util.spec_from_file_location("hpcobs_checks_shared", SHARED)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["hpcobs_checks_shared"] = module
    return module


COMPONENT_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DURATION = re.compile(r"^[0-9]+(ms|s|m|h)$")


def _string(value):
    """An Alloy string literal (Alloy strings take Go's escapes; JSON's are a subset of them)."""
    return json.dumps(str(value))


def _value(value, indent):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, dict):
        if not value:
            return "{}"
        pad = "  " * (indent + 1)
        fields = ["%s%s = %s," % (pad, _string(k), _value(v, indent + 1)) for k, v in value.items()]
        return "{\n" + "\n".join(fields) + "\n" + "  " * indent + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        pad = "  " * (indent + 1)
        return "[\n" + "\n".join("%s%s," % (pad, _value(v, indent + 1)) for v in value) + "\n" + "  " * indent + "]"
    if isinstance(value, Ref):
        return value.name
    return _string(value)


class Ref:
    """A reference to another component's export (written unquoted)."""

    def __init__(self, name):
        self.name = name


def _block(name, label, body, indent=0):
    pad = "  " * indent
    head = "%s%s %s {" % (pad, name, _string(label)) if label is not None else "%s%s {" % (pad, name)
    lines = [head]
    for key, value in body:
        if isinstance(value, Block):
            lines.append(_block(value.name, None, value.body, indent + 1))
        else:
            lines.append("%s  %s = %s" % (pad, key, _value(value, indent + 1)))
    lines.append(pad + "}")
    return "\n".join(lines)


class Block:
    def __init__(self, name, body):
        self.name, self.body = name, body


def _job_label(job):
    """A component label from a job name (Alloy labels are identifiers)."""
    label = re.sub(r"[^A-Za-z0-9_]", "_", job)
    return label if re.match(r"^[A-Za-z_]", label) else "job_" + label


def alloy_config(settings):
    """The whole configuration file (text) from the role's settings (see vars/main.yml, _alloy_settings)."""
    parts = ["// Managed by hpcobs (roles/alloy): change the role's variables, not this file.",
             _block("logging", None, [("level", settings.get("log_level", "info")), ("format", "logfmt")])]
    if _true(settings.get("server_tls")):
        parts.append(_block("http", None, [("tls", Block("tls", [
            ("cert_file", settings["server_cert_file"]),
            ("key_file", settings["server_key_file"]),
            ("client_ca_file", settings["server_client_ca_file"]),
            ("client_auth_type", "RequireAndVerifyClientCert"),
            ("min_version", "TLS12")]))]))
    endpoints = []
    for url in settings["loki_urls"]:
        body = [("url", url.rstrip("/") + "/loki/api/v1/push"),
                ("batch_wait", settings["batchwait"]),
                ("batch_size", settings["batchsize"])]
        if settings.get("tenant_id"):
            body.append(("tenant_id", settings["tenant_id"]))
        if settings.get("username"):
            body.append(("basic_auth", Block("basic_auth", [("username", settings["username"]),
                                                            ("password_file", settings["password_file"])])))
        if settings.get("ca_file"):
            body.append(("tls_config", Block("tls_config", [("ca_file", settings["ca_file"])])))
        endpoints.append(("endpoint", Block("endpoint", body)))
    external = dict(settings.get("external_labels") or {})
    external["node"] = settings["node_label"]
    parts.append(_block("loki.write", "default", endpoints + [("external_labels", external)]))
    receiver = [Ref("loki.write.default.receiver")]
    if settings.get("journal_enabled"):
        rules = [("rule", Block("rule", [("source_labels", [field]), ("target_label", label)]))
                 for field, label in settings["journal_labels"].items()]
        parts.append(_block("loki.relabel", "journal", [("forward_to", [])] + rules))
        parts.append(_block("loki.source.journal", "journal", [
            ("max_age", settings["journal_max_age"]),
            ("format_as_json", False),
            ("labels", {"job": "systemd-journal"}),
            ("relabel_rules", Ref("loki.relabel.journal.rules")),
            ("forward_to", receiver)]))
    for target in settings.get("file_targets") or []:
        label = _job_label(target["job"])
        paths = [dict(target.get("labels") or {}, __path__=path, job=target["job"]) for path in target["paths"]]
        parts.append(_block("local.file_match", label, [("path_targets", paths)]))
        parts.append(_block("loki.source.file", label, [
            ("targets", Ref("local.file_match.%s.targets" % label)),
            ("forward_to", receiver)]))
    return "\n\n".join(parts) + "\n"


def alloy_problems(settings):
    """Every problem of the role's settings, as strings (empty when there is none)."""
    problems = []
    shared = _checks()  # the checks Promtail shares (playbooks/filter_plugins/hpcobs_checks.py)
    secured = str(settings.get("security", False)).strip().lower() == "true"
    problems += shared.loki_client_problems(settings.get("loki_urls"), settings.get("tenant_id"), "alloy", secured)
    if secured and (settings.get("site_username") or _true(settings.get("site_password"))):
        problems.append("hpcobs_security is on: Alloy presents the host's own credential (loki-push-<host>, roles/pki) "
                        "at Loki's front, so alloy_loki_username and alloy_loki_password must stay empty")
    elif bool(settings.get("username")) != _true(settings.get("has_password")):
        problems.append("alloy_loki_username and alloy_loki_password go together (both set, or both empty)")
    problems += shared.log_label_problems(settings.get("node_label"), settings.get("external_labels"),
                                          settings.get("journal_labels"), "alloy")
    if not DURATION.match(str(settings.get("journal_max_age"))):
        problems.append("alloy_journal_max_age must be a duration like 12h")
    targets = settings.get("file_targets")
    # component labels are derived from job names here, so two jobs must not map to the same label either
    problems += shared.file_target_problems(targets, "alloy_file_targets", bool(settings.get("journal_enabled")),
                                            same_job=_job_label)
    if not settings.get("journal_enabled") and isinstance(targets, list) and not targets:
        problems.append("nothing to read: enable the journal or list file targets")
    if not DURATION.match(str(settings.get("batchwait"))):
        problems.append("alloy_batchwait must be a duration like 1s")
    if settings.get("log_level", "info") not in ("debug", "info", "warn", "error"):
        problems.append("alloy_log_level must be debug, info, warn or error")
    if not re.match(r"^[0-9]+(B|KiB|MiB|KB|MB)$", str(settings.get("batchsize"))):
        problems.append("alloy_batchsize must be a size like 1MiB")
    return problems


def _true(value):
    return value is True or str(value).strip().lower() == "true"


def alloy_config_filter(settings):
    problems = alloy_problems(settings)
    if problems:
        raise AnsibleFilterError("alloy: " + "; ".join(problems))
    return alloy_config(settings)


class FilterModule:
    def filters(self):
        return {"alloy_config": alloy_config_filter, "alloy_problems": alloy_problems}
