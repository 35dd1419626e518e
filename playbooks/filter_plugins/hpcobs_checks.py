"""Checks of inputs shared by several roles, as pure functions returning the problems found (unit-tested in
tests/test_checks.py).

- `hpcobs_file_target_problems`: the file targets both log shippers read (roles/promtail `promtail_file_targets`,
  roles/alloy `alloy_file_targets`): a list of {job, paths, labels}, job names unique and safe, paths absolute,
  label names valid Loki label names.
- `hpcobs_loki_client_problems`, `hpcobs_log_label_problems`: where both shippers push (Loki base URLs, tenant)
  and the labels they put on every stream (node, external labels, journal fields mapped to labels).
- `hpcobs_dcgm_counters`: dcgm-exporter's counters CSV (roles/dcgm_exporter), parsed with the rules dcgm-exporter
  applies when it starts (internal/pkg/counters/counter_config.go, ExtractCounters, of the 4.x releases): one
  record per row, `FIELD, TYPE, HELP`, the field a DCGM_FI_* or DCGM_EXP_* name, the type one of gauge, counter,
  histogram, summary, label. The project adds its own rules: no comma in the help text (the role's CSV is read as
  plain comma-separated text, quoting is not used), every field once, the readiness metric exported.
- `hpcobs_roles_text_names`, `hpcobs_control_char_problems`: no control character (U+0000-U+001F, U+007F) in any
  free-text setting. A line feed in a `*_extra_args` word ends the unit's ExecStart= line and starts a directive of
  the site's choosing (`User=root`); in a grafana_ini key or value it starts a setting; in a flag it splits it. Every
  option of every role's meta/argument_specs.yml that is not a number or a boolean is checked (strings, paths, and
  every key and value inside lists and mappings), so a new variable is covered without being listed; only the
  options of CONTROL_EXEMPT are not (text that may span lines by design, written only through a YAML serializer,
  which quotes it). playbooks/preflight.yml runs it for every host of a site before any role; roles/service
  preflight_os for a role applied on its own.
- `hpcobs_duration_seconds`: a Prometheus duration (`90s`, `1m30s`, `2h`) in seconds, so a check can compare two
  settings (vmalert's field lookback against its rule interval).
- `hpcobs_sample_interval_problems`: the site's GPU sample interval (`hpcobs_gpu_sample_interval`) as each host of
  a run sees it: a duration of 1 s to 5 min, the same on every host (the GPU nodes collect at it, the management
  hosts scrape at it).
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping

import yaml
from jinja2.exceptions import UndefinedError

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

JOB = re.compile(r"^[A-Za-z0-9_.-]+$")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TARGET_KEYS = ("job", "paths", "labels")
JOURNAL_JOB = "systemd-journal"

JOURNAL_LABEL = re.compile(r"^__journal_[a-z0-9_]+$")
URL = re.compile(r"^https?://[^/\s\"]+(/[^\s\"]*)?$")
TENANT = re.compile(r"^[A-Za-z0-9!._*()'-]{0,150}$")

FIELD = re.compile(r"^DCGM_(FI|EXP)_[A-Z0-9_]+$")
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
EXTRA_FIELD_KEYS = ("field", "type", "help")


def _text(value):
    return json.dumps(value, default=str)


def file_target_problems(targets, variable="file_targets", journal=False, same_job=None):
    """Problems of a log shipper's file targets, as strings naming `variable` (empty when there is none).

    journal: the journal is read too, under job "systemd-journal", so no file target may take that name.
    same_job: optional function giving the key two jobs must not share (Alloy derives component labels from job
    names, so "a-b" and "a_b" collide there); the job name itself by default.
    """
    if not isinstance(targets, (list, tuple)):
        return ["%s must be a list of {job, paths, labels}, got %s" % (variable, _text(targets))]
    key = same_job or (lambda job: job)
    problems = []
    seen = {key(JOURNAL_JOB)} if journal else set()
    for number, target in enumerate(targets, 1):
        if not isinstance(target, dict):
            problems.append("%s entry %d must be a mapping {job, paths, labels}, got %s"
                            % (variable, number, _text(target)))
            continue
        job = target.get("job", "")
        # a number is a name (YAML reads job: 7 as one); anything else is shown as JSON and refused
        job = str(job) if isinstance(job, (str, int)) and not isinstance(job, bool) else _text(job)
        if not JOB.match(job):
            problems.append("%s entry %d: job %s must match [A-Za-z0-9_.-]+" % (variable, number, _text(job)))
        if key(job) in seen:
            problems.append("%s: job %s is used twice" % (variable, job))
        seen.add(key(job))
        for name in sorted(str(k) for k in target if k not in TARGET_KEYS):
            problems.append("%s: job %s: unknown key %s (known: %s)" % (variable, job, name, ", ".join(TARGET_KEYS)))
        paths = target.get("paths")
        if not isinstance(paths, (list, tuple)) or not paths:
            problems.append("%s: job %s: paths must be a non-empty list of absolute paths or globs, got %s"
                            % (variable, job, _text(paths)))
        else:
            problems += ["%s: job %s: path %s is not absolute" % (variable, job, _text(path))
                         for path in paths if not isinstance(path, str) or not path.startswith("/")]
        labels = target.get("labels", {})
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            problems.append("%s: job %s: labels must be a mapping of label names to values, got %s"
                            % (variable, job, _text(labels)))
            continue
        for name in labels:
            if not isinstance(name, str) or not LABEL.match(name) or name.startswith("__"):
                problems.append("%s: job %s: label %s is not a valid label name" % (variable, job, _text(name)))
    return problems


def loki_client_problems(urls, tenant, prefix, secured=False):
    """Problems of `<prefix>_loki_urls` (a non-empty list of http(s) base URLs; https only when the site's security
    switch is on: Loki's front takes nothing else) and `<prefix>_loki_tenant_id` (empty or a Loki tenant id)."""
    problems = []
    if not isinstance(urls, (list, tuple)) or not urls or not all(isinstance(u, str) and URL.match(u) for u in urls):
        problems.append("%s_loki_urls must be a non-empty list of http(s) base URLs such as [\"http://mgmt01:3100\"], "
                        "got %s" % (prefix, _text(urls)))
    elif str(secured).strip().lower() == "true" and not all(u.startswith("https://") for u in urls):
        problems.append("hpcobs_security is on: Loki's front speaks HTTPS only, so every %s_loki_urls entry must be an "
                        "https:// URL (hpcobs_loki_urls too), got %s" % (prefix, _text(urls)))
    if not isinstance(tenant, str) or not TENANT.match(tenant):
        problems.append("%s_loki_tenant_id must be empty or a Loki tenant id (letters, digits and !._*()'- , at most "
                        "150), got %s" % (prefix, _text(tenant)))
    return problems


def _label_name(name):
    return isinstance(name, str) and bool(LABEL.match(name)) and not name.startswith("__")


def log_label_problems(node_label, external_labels, journal_labels, prefix):
    """Problems of `<prefix>_node_label` (non-empty text), `<prefix>_external_labels` (valid label names, not node
    nor __*, to values) and `<prefix>_journal_labels` (journal labels __journal_<field> to distinct label names
    other than node and job)."""
    problems = []
    if not isinstance(node_label, str) or not node_label:
        problems.append("%s_node_label must be a non-empty string, got %s" % (prefix, _text(node_label)))
    if not isinstance(external_labels, dict) or not all(_label_name(k) and k != "node" for k in external_labels):
        problems.append("%s_external_labels must map valid label names (not node, which %s_node_label sets, nor "
                        "__*) to values, got %s" % (prefix, prefix, _text(external_labels)))
    journal = journal_labels
    if not isinstance(journal, dict) or not all(
            isinstance(k, str) and JOURNAL_LABEL.match(k) and _label_name(v) and v not in ("node", "job")
            for k, v in journal.items()) or len(set(map(str, journal.values()))) != len(journal):
        problems.append("%s_journal_labels must map journal labels (__journal_<field>) to distinct label names "
                        "other than node and job, got %s" % (prefix, _text(journal)))
    return problems


def extra_field_problems(fields, variable="dcgm_exporter_extra_fields"):
    """Problems of the rows a site appends to the counters CSV ([{field, type, help}])."""
    if not isinstance(fields, (list, tuple)):
        return ["%s must be a list of {field, type, help}, got %s" % (variable, _text(fields))]
    problems = []
    for entry in fields:
        why = []
        if not isinstance(entry, dict):
            why.append("it is not a mapping")
        else:
            unknown = sorted(str(k) for k in entry if k not in EXTRA_FIELD_KEYS)
            if unknown:
                why.append("unknown key(s) %s" % ", ".join(unknown))
            field, kind, text = entry.get("field", ""), entry.get("type", ""), entry.get("help", "")
            if not isinstance(field, str) or not FIELD.match(field):
                why.append("field %s is not a DCGM_FI_* or DCGM_EXP_* name" % _text(field))
            if kind not in PROM_TYPES:
                why.append("type %s is not a Prometheus type dcgm-exporter knows" % _text(kind))
            if not isinstance(text, str) or not text or re.search(r"[,\n\r]", text):
                why.append("help is empty or has a comma or a line break")
        if why:
            problems.append("%s entry %s is invalid (%s): it needs field (a DCGM field name such as "
                            "DCGM_FI_DEV_FB_TOTAL), type (gauge, counter, histogram, summary or label) and help (text "
                            "without commas or line breaks), and nothing else" % (variable, _text(entry), "; ".join(why)))
    return problems


def _row(line):
    """(field, type, help) of a CSV row, or None when it is not a row dcgm-exporter (and the project) accepts."""
    parts = [part.strip(" ") for part in line.split(",")]
    if len(parts) != 3 or not FIELD.match(parts[0]) or parts[1] not in PROM_TYPES:
        return None
    return tuple(parts)


# The field the management host counts GPUs by: the GPU inventory, the owner record every GPU alert starts from
# (roles/vmalert, gpu:hpcobs_gpu_owner:info) and the dashboards' GPU lists. Without it no GPU alert can fire.
GPU_PRESENCE_FIELD = "DCGM_FI_DEV_GPU_TEMP"


def dcgm_counters(text, extra_fields=(), ready_metric="", source="the counters CSV"):
    """The counters CSV `text` with `extra_fields` appended, parsed and checked.

    Returns {"rows": [[field, type, help]...], "fields": [every field], "metric_fields": [fields exported as
    metrics, i.e. not of type label], "problems": [strings]}. Comment lines (#) and empty lines are skipped, as
    dcgm-exporter's CSV reader does; leading and trailing blanks of a line and of each value are ignored.
    """
    if not isinstance(text, str):
        raise AnsibleFilterError("hpcobs_dcgm_counters expects the text of the CSV, got %s" % type(text).__name__)
    problems = extra_field_problems(extra_fields)
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not problems:
        lines += ["%s, %s, %s" % (e["field"], e["type"], e["help"]) for e in extra_fields]
    rows, seen, twice = [], set(), []
    for line in lines:
        row = _row(line)
        if row is None:
            problems.append('%s: row %s is not "DCGM_field, type, help" (field DCGM_FI_* or DCGM_EXP_*, type gauge, '
                            "counter, histogram, summary or label, no comma in help)" % (source, _text(line)))
            continue
        if row[0] in seen and row[0] not in twice:
            twice.append(row[0])
        seen.add(row[0])
        rows.append(list(row))
    problems += ["%s: %s is listed twice" % (source, field) for field in twice]
    metric_fields = [row[0] for row in rows if row[1] != "label"]
    if rows and GPU_PRESENCE_FIELD not in metric_fields:
        problems.append("%s does not export %s: the management host counts GPUs by it, and no GPU alert can fire "
                        "without it" % (source, GPU_PRESENCE_FIELD))
    if ready_metric and ready_metric not in metric_fields:
        problems.append("dcgm_exporter_ready_metric %s is not one of the fields %s exports" % (ready_metric, source))
    return {"rows": rows, "fields": [row[0] for row in rows], "metric_fields": metric_fields, "problems": problems}


UNSET = "__hpcobs_unset__"  # what a vars lookup gives for a setting nobody set (as in hpcobs_inputs.py)
NOT_TEXT = ("int", "float", "bool")
# Options whose values may span lines by design; each is written only with to_nice_yaml, which quotes a line break.
CONTROL_EXEMPT = {
    "alertmanager_receivers": "notification templates (text, title, message) are multi-line Go templates",
    "loki_rule_groups": "multi-line LogQL expressions and annotations",
    "vmalert_site_rule_groups": "multi-line MetricsQL expressions and annotations",
    "grafana_datasources_extra": "PEM certificates in secureJsonData (tlsCACert, tlsClientCert)",
    "promtail_extra_scrape_configs": "pipeline stages (template, regex) may span lines",
    "promtail_config_overrides": "any Promtail setting, including multi-line pipeline stages",
    "loki_config_overrides": "any Loki setting",
    "victoriametrics_scrape_jobs": "inline PEM of a scrape job's tls_config (ca, cert, key)",
    "victoriametrics_scrape_jobs_overrides": "inline PEM of a scrape job's tls_config (ca, cert, key)",
}
# Settings outside the roles' argument specs that reach flags and configuration files.
GLOBAL_TEXT = ("hpcobs_address", "hpcobs_loki_urls", "hpcobs_alertmanager_urls", "hpcobs_loki_tenant_id",
               "hpcobs_log_external_labels", "hpcobs_log_journal_labels", "hpcobs_log_shipper",
               "hpcobs_components_disabled")
# Roles whose options are set by other roles, not by a site.
INTERNAL_ROLES = ("service", "artifact")
CHARACTER_NAMES = {0: "NUL", 9: "tab", 10: "line feed", 13: "carriage return", 27: "escape", 127: "delete"}


def text_names(spec_texts, role=None):
    """Names of the free-text options (not int, float or bool; not exempt) of the roles' argument specs
    ([(role, text)] pairs), of `role` only when given, else of every site-facing role plus GLOBAL_TEXT."""
    names = set() if role else set(GLOBAL_TEXT)
    for name, text in spec_texts:
        if (role and name != role) or (not role and name in INTERNAL_ROLES):
            continue
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise AnsibleFilterError("roles/%s/meta/argument_specs.yml is not YAML: %s" % (name, exc))
        for entry in (data.get("argument_specs") or {}).values():
            for option, spec in ((entry or {}).get("options") or {}).items():
                if (spec or {}).get("type", "str") not in NOT_TEXT and str(option) not in CONTROL_EXEMPT:
                    names.add(str(option))
    return sorted(names)


def roles_text_names(roles_dir, role=None):
    """text_names of roles/*/meta/argument_specs.yml under roles_dir (of `role` only when given)."""
    pattern = os.path.join(str(roles_dir), role or "*", "meta", "argument_specs.yml")
    pairs = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as handle:
            pairs.append((path.split(os.sep)[-3], handle.read()))
    if not pairs:
        raise AnsibleFilterError("no argument specs matching %s" % pattern)
    return text_names(pairs, role)


def _control(text):
    return [i for i, char in enumerate(text) if ord(char) < 0x20 or ord(char) == 0x7f]


def _where(path):
    return path[0] + "".join("[%d]" % p if isinstance(p, int) else "[%s]" % json.dumps(p, default=str)
                             for p in path[1:])


def _text_problem(what, text):
    found = _control(text)
    if not found:
        return []
    code = ord(text[found[0]])
    more = " (and %d more)" % (len(found) - 1) if len(found) > 1 else ""
    # the value itself is not shown: it may be a password
    return ["%s has a control character, %s (U+%04X), at position %d%s"
            % (what, CHARACTER_NAMES.get(code, "control"), code, found[0] + 1, more)]


def _walk(value, path, problems):
    if isinstance(value, str):
        problems += _text_problem(_where(path), value)
    elif isinstance(value, Mapping):
        for key in list(value.keys()):
            if isinstance(key, str):
                problems += _text_problem("a key of %s" % _where(path), key)
            _walk_entry(value, key, path + [key], problems)
    elif isinstance(value, (list, tuple)):
        for number in range(len(value)):
            _walk_entry(value, number, path + [number], problems)


def _walk_entry(container, key, path, problems):
    """One entry of a mapping or list. An entry that is a template of a variable not defined yet (a role default
    such as "{{ alertmanager_secrets_dir }}/pager", which a site writes in its inventory) is skipped: the preflight
    runs before the roles and cannot render it. Ansible raises UndefinedError when such an entry is read."""
    try:
        item = container[key]
    except UndefinedError:
        return
    _walk(item, path, problems)


def control_char_problems(values):
    """Messages naming each setting (and the entry inside it) that holds a control character, with its position
    counted from 1. values: {variable: value}; None and UNSET (nobody set it) are skipped."""
    problems = []
    for name in sorted(values):
        value = values[name]
        if value is None or value == UNSET:
            continue
        _walk(value, [name], problems)
    if problems:
        problems.append("Control characters end a line of a systemd unit or an ini file and split a command-line "
                        "flag, so they are refused in every setting that reaches one; remove them")
    return problems


DURATION = re.compile(r"^(?:[0-9]+(?:ms|s|m|h|d|w|y))+$")
DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(text):
    """A Prometheus duration (one or more number-unit pairs, units ms s m h d w y) in seconds."""
    if not isinstance(text, str) or not DURATION.match(text):
        raise AnsibleFilterError("%s is not a duration like 30s, 1m30s or 2h" % json.dumps(text, default=str))
    return sum(int(number) * DURATION_UNITS[unit] for number, unit in DURATION_PART.findall(text))


def sample_interval_problems(by_host, variable="hpcobs_gpu_sample_interval"):
    """Problems of `variable` given {host: value} of the hosts of a run: each value a duration from 1 s to 5 min,
    one value on every host. Empty when there is none."""
    problems = []
    seen = {}
    for host, value in sorted(by_host.items()):
        try:
            seconds = duration_seconds(value)
        except AnsibleFilterError:
            problems.append("%s on %s must be a duration like 30s (got %s)" % (variable, host,
                                                                              json.dumps(value, default=str)))
            continue
        if not 1 <= seconds <= 300:
            problems.append("%s on %s must be from 1s to 5m (got %s)" % (variable, host, value))
            continue
        seen.setdefault(seconds, []).append(host)
    if len(seen) > 1:
        problems.append("%s differs between hosts (%s): the GPU nodes collect and the management hosts scrape at "
                        "it, so set it once for all hosts (group_vars/all)" % (variable, "; ".join(
                            "%gs on %s" % (seconds, ", ".join(hosts[:3]) + (" and %d more" % (len(hosts) - 3)
                                                                          if len(hosts) > 3 else ""))
                            for seconds, hosts in sorted(seen.items()))))
    return problems


class FilterModule:
    def filters(self):
        return {
            "hpcobs_file_target_problems": file_target_problems,
            "hpcobs_loki_client_problems": loki_client_problems,
            "hpcobs_log_label_problems": log_label_problems,
            "hpcobs_dcgm_counters": dcgm_counters,
            "hpcobs_roles_text_names": roles_text_names,
            "hpcobs_control_char_problems": control_char_problems,
            "hpcobs_duration_seconds": duration_seconds,
            "hpcobs_sample_interval_problems": sample_interval_problems,
        }
