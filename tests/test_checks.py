"""playbooks/filter_plugins/hpcobs_checks.py: the file-target checks both log shippers share, and the counters-CSV
parser of roles/dcgm_exporter (dcgm-exporter's row rules)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("hpcobs_checks", os.path.join(ROOT, "playbooks", "filter_plugins",
                                                                            "hpcobs_checks.py"))
checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checks)
alloy_spec = importlib.util.spec_from_file_location(
    "hpcobs_alloy_checks", os.path.join(ROOT, "roles", "alloy", "filter_plugins", "hpcobs_alloy.py"))
alloy = importlib.util.module_from_spec(alloy_spec)
alloy_spec.loader.exec_module(alloy)

SLURM = {"job": "slurm", "paths": ["/var/log/slurm/*.log"]}
CSV = """# comment, with commas, ignored
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (C).

  DCGM_FI_DEV_XID_ERRORS ,gauge,Last XID.
DCGM_FI_DRIVER_VERSION, label, Driver version.
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
DCGM_EXP_XID_ERRORS_COUNT, counter, XID errors seen.
"""


def problems(targets, **kwargs):
    return checks.file_target_problems(targets, "promtail_file_targets", **kwargs)


def test_good_targets_have_no_problem():
    assert problems([]) == []
    assert problems([SLURM, {"job": "nvidia.driver-1", "paths": ["/var/log/nvidia*.log", "/x/y"],
                             "labels": {"component": "driver", "_x9": "y"}}], journal=True) == []
    assert problems([dict(SLURM, labels=None)]) == []


@pytest.mark.parametrize("targets,journal,expected", [
    ("slurm", False, 'promtail_file_targets must be a list of {job, paths, labels}, got "slurm"'),
    ({"job": "x"}, False, "promtail_file_targets must be a list"),
    (["slurm"], False, 'promtail_file_targets entry 1 must be a mapping {job, paths, labels}, got "slurm"'),
    ([{"job": "a b", "paths": ["/x"]}], False, 'promtail_file_targets entry 1: job "a b" must match [A-Za-z0-9_.-]+'),
    ([{"paths": ["/x"]}], False, 'promtail_file_targets entry 1: job "" must match'),
    ([SLURM, {"job": ["a"], "paths": ["/x"]}], False, 'promtail_file_targets entry 2: job "[\\"a\\"]" must match'),
    ([SLURM, SLURM], False, "promtail_file_targets: job slurm is used twice"),
    ([dict(SLURM, job="systemd-journal")], True, "job systemd-journal is used twice"),
    ([{"job": "x", "paths": ["var/log/x.log"]}], False, 'job x: path "var/log/x.log" is not absolute'),
    ([{"job": "x", "paths": ["/ok", 3]}], False, "job x: path 3 is not absolute"),
    ([{"job": "x", "paths": "/var/log/x.log"}], False, "job x: paths must be a non-empty list"),
    ([{"job": "x", "paths": []}], False, "job x: paths must be a non-empty list"),
    ([{"job": "x"}], False, "job x: paths must be a non-empty list of absolute paths or globs, got null"),
    ([dict(SLURM, path="/x")], False, "job slurm: unknown key path (known: job, paths, labels)"),
    ([dict(SLURM, labels={"9x": "a"})], False, 'job slurm: label "9x" is not a valid label name'),
    ([dict(SLURM, labels={"__path__": "/y"})], False, 'job slurm: label "__path__" is not a valid label name'),
    ([dict(SLURM, labels={"a-b": "c"})], False, 'label "a-b" is not a valid label name'),
    ([dict(SLURM, labels=["a"])], False, 'job slurm: labels must be a mapping of label names to values, got ["a"]'),
])
def test_bad_targets_are_named(targets, journal, expected):
    found = problems(targets, journal=journal)
    assert any(expected in p for p in found), found


def test_the_journal_job_is_free_when_the_journal_is_off():
    assert problems([dict(SLURM, job="systemd-journal")], journal=False) == []


def test_a_number_is_a_job_name():
    assert problems([dict(SLURM, job=7)]) == []


def test_every_problem_is_reported_once():
    found = problems([{"job": "a b", "paths": ["rel"], "extra": 1}, {"job": "a b", "paths": ["/x"]}])
    # entry 1: job, unknown key, path; entry 2: job, used twice
    assert len(found) == 5, found
    assert sum("used twice" in p for p in found) == 1


def test_same_job_key_catches_jobs_that_collide_after_mapping():
    # Alloy names components after the job: "a-b" and "a_b" both become a_b
    assert problems([{"job": "a-b", "paths": ["/x"]}, {"job": "a_b", "paths": ["/y"]}]) == []
    found = problems([{"job": "a-b", "paths": ["/x"]}, {"job": "a_b", "paths": ["/y"]}], same_job=alloy._job_label)
    assert found == ["promtail_file_targets: job a_b is used twice"]


def test_alloy_uses_the_shared_checks():
    settings = {"loki_urls": ["http://mgmt01:3100"], "tenant_id": "", "username": "", "has_password": False,
                "node_label": "gpu01", "external_labels": {}, "journal_labels": {}, "journal_enabled": True,
                "journal_max_age": "12h", "batchwait": "1s", "batchsize": "1MiB", "log_level": "info",
                "file_targets": [dict(SLURM, labels={"__x": "y"}), {"job": "systemd-journal", "paths": ["/z"]}]}
    assert alloy.alloy_problems(settings) == [
        'alloy_file_targets: job slurm: label "__x" is not a valid label name',
        "alloy_file_targets: job systemd-journal is used twice"]
    assert alloy.alloy_problems(dict(settings, file_targets="x")) == [
        'alloy_file_targets must be a list of {job, paths, labels}, got "x"']
    with pytest.raises(Exception, match="used twice"):
        alloy.alloy_config_filter(settings)


JOURNAL = {"__journal__systemd_unit": "unit", "__journal_priority_keyword": "priority"}


def test_good_loki_clients_and_labels_have_no_problem():
    assert checks.loki_client_problems(["http://mgmt01:3100", "https://loki.example.org/base/"], "", "x") == []
    assert checks.loki_client_problems(["http://[::1]:3100"], "hpc1!._*()'-", "x") == []
    assert checks.log_label_problems("gpu01", {"cluster": "hpc1", "_x": "y"}, JOURNAL, "x") == []
    assert checks.log_label_problems("gpu01", {}, {}, "x") == []


@pytest.mark.parametrize("urls,tenant,expected", [
    ([], "", 'promtail_loki_urls must be a non-empty list of http(s) base URLs such as ["http://mgmt01:3100"], got []'),
    ("http://a:3100", "", 'promtail_loki_urls must be a non-empty list of http(s) base URLs such as '
     '["http://mgmt01:3100"], got "http://a:3100"'),
    (["mgmt01:3100"], "", 'got ["mgmt01:3100"]'),
    (["http://a b:3100"], "", "promtail_loki_urls must be"),
    (["http://a:3100", 3100], "", "promtail_loki_urls must be"),
    (["http://a:3100"], "a/b", 'promtail_loki_tenant_id must be empty or a Loki tenant id'),
    (["http://a:3100"], "x" * 151, "promtail_loki_tenant_id must be empty"),
    (["http://a:3100"], None, "promtail_loki_tenant_id must be empty or a Loki tenant id (letters, digits and "
     "!._*()'- , at most 150), got null"),
])
def test_bad_loki_clients_are_named(urls, tenant, expected):
    (problem,) = checks.loki_client_problems(urls, tenant, "promtail")
    assert expected in problem, problem


@pytest.mark.parametrize("node,external,journal,expected", [
    ("", {}, JOURNAL, 'alloy_node_label must be a non-empty string, got ""'),
    (["gpu01"], {}, JOURNAL, "alloy_node_label must be a non-empty string"),
    ("gpu01", {"node": "x"}, JOURNAL, 'alloy_external_labels must map valid label names (not node, which '
     'alloy_node_label sets, nor __*) to values, got {"node": "x"}'),
    ("gpu01", {"bad-name": "x"}, JOURNAL, "alloy_external_labels must map"),
    ("gpu01", {"__x": "x"}, JOURNAL, "alloy_external_labels must map"),
    ("gpu01", ["cluster"], JOURNAL, 'alloy_external_labels must map valid label names'),
    ("gpu01", {}, {"_SYSTEMD_UNIT": "unit"}, 'alloy_journal_labels must map journal labels (__journal_<field>) to '
     'distinct label names other than node and job, got {"_SYSTEMD_UNIT": "unit"}'),
    ("gpu01", {}, {"__journal__comm": "job"}, "other than node and job"),
    ("gpu01", {}, {"__journal__comm": "node"}, "other than node and job"),
    ("gpu01", {}, {"__journal__comm": "__x"}, "alloy_journal_labels must map"),
    ("gpu01", {}, {"__journal__comm": "a", "__journal__exe": "a"}, "distinct label names"),
    ("gpu01", {}, {"__journal__COMM": "comm"}, "alloy_journal_labels must map"),
    ("gpu01", {}, "unit", "alloy_journal_labels must map"),
])
def test_bad_labels_are_named(node, external, journal, expected):
    (problem,) = checks.log_label_problems(node, external, journal, "alloy")
    assert expected in problem, problem


def test_counters_parse_like_dcgm_exporter():
    result = checks.dcgm_counters(CSV, ready_metric="DCGM_FI_DEV_GPU_TEMP")
    assert result["problems"] == []
    assert result["rows"][1] == ["DCGM_FI_DEV_XID_ERRORS", "gauge", "Last XID."]
    assert result["fields"] == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DRIVER_VERSION",
                                "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_EXP_XID_ERRORS_COUNT"]
    # a label row adds a label, it is not a metric
    assert "DCGM_FI_DRIVER_VERSION" not in result["metric_fields"]
    assert len(result["metric_fields"]) == 4


def test_extra_fields_are_appended():
    extra = [{"field": "DCGM_FI_DEV_FB_TOTAL", "type": "gauge", "help": "Total memory in MiB."}]
    result = checks.dcgm_counters(CSV, extra, "DCGM_FI_DEV_FB_TOTAL")
    assert result["problems"] == []
    assert result["rows"][-1] == ["DCGM_FI_DEV_FB_TOTAL", "gauge", "Total memory in MiB."]


@pytest.mark.parametrize("line,why", [
    ("DCGM_FI_DEV_FB_USED, gauge", "only two values"),
    ("DCGM_FI_DEV_FB_USED, gauge, Used, in MiB.", "a comma in help"),
    ("DCGM_FI_DEV_FB_USED, gauges, Used.", "an unknown type"),
    ("DCGM_FI_DEV_FB_USED, Gauge, Used.", "types are lower case"),
    ("DCGM_DEV_FB_USED, gauge, Used.", "neither DCGM_FI_ nor DCGM_EXP_"),
    ("dcgm_fi_dev_fb_used, gauge, Used.", "a lower-case name"),
    ("DCGM_FI_DEV_FB_USED gauge Used.", "no comma at all"),
])
def test_bad_rows_are_named(line, why):
    result = checks.dcgm_counters(CSV + line + "\n")
    assert result["problems"] == ['the counters CSV: row "%s" is not "DCGM_field, type, help" (field DCGM_FI_* or '
                                  "DCGM_EXP_*, type gauge, counter, histogram, summary or label, no comma in help)"
                                  % line], why
    assert "DCGM_FI_DEV_FB_USED" not in result["fields"]


def test_duplicate_fields_are_named_once():
    text = CSV + "DCGM_FI_DEV_GPU_TEMP, gauge, Again.\nDCGM_FI_DEV_GPU_TEMP,gauge,And again.\n"
    assert checks.dcgm_counters(text, source="x.csv")["problems"] == ["x.csv: DCGM_FI_DEV_GPU_TEMP is listed twice"]


def test_an_extra_field_already_in_the_csv_is_a_duplicate():
    extra = [{"field": "DCGM_FI_DEV_GPU_TEMP", "type": "gauge", "help": "Temperature again."}]
    assert checks.dcgm_counters(CSV, extra)["problems"] == ["the counters CSV: DCGM_FI_DEV_GPU_TEMP is listed twice"]


@pytest.mark.parametrize("ready", ["DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_FB_FREE"])
def test_the_ready_metric_must_be_exported(ready):
    assert checks.dcgm_counters(CSV, ready_metric=ready)["problems"] == [
        "dcgm_exporter_ready_metric %s is not one of the fields the counters CSV exports" % ready]


def test_the_gpu_presence_field_is_required():
    text = "\n".join(line for line in CSV.splitlines() if "GPU_TEMP" not in line) + "\n"
    assert checks.dcgm_counters(text, source="x.csv")["problems"] == [
        "x.csv does not export DCGM_FI_DEV_GPU_TEMP: the management host counts GPUs by it, and no GPU alert can "
        "fire without it"]
    as_label = text + "DCGM_FI_DEV_GPU_TEMP, label, Not a metric.\n"
    assert "does not export DCGM_FI_DEV_GPU_TEMP" in checks.dcgm_counters(as_label)["problems"][0]


@pytest.mark.parametrize("entry,words", [
    ({"field": "DCGM_FI_DEV_FB_TOTAL", "type": "gauge", "help": "Total memory, in MiB"},
     ['"help": "Total memory, in MiB"', "help is empty or has a comma", "help (text without commas"]),
    ({"field": "DCGM_FI_DEV_FB_TOTAL", "type": "gauge", "help": ""}, ["help is empty"]),
    ({"field": "DCGM_FI_DEV_FB_TOTAL", "type": "gauge", "help": "a\nb"}, ["or a line break"]),
    ({"field": "FB_TOTAL", "type": "gauge", "help": "x"}, ['field "FB_TOTAL" is not a DCGM_FI_* or DCGM_EXP_* name']),
    ({"field": "DCGM_FI_DEV_FB_TOTAL", "type": "int", "help": "x"}, ['type "int" is not a Prometheus type']),
    ({"field": "DCGM_FI_DEV_FB_TOTAL", "help": "x"}, ['type "" is not a Prometheus type']),
    ({"field": "DCGM_FI_DEV_FB_TOTAL", "type": "gauge", "help": "x", "unit": "MiB"}, ["unknown key(s) unit"]),
    ("DCGM_FI_DEV_FB_TOTAL", ['entry "DCGM_FI_DEV_FB_TOTAL" is invalid (it is not a mapping)']),
])
def test_bad_extra_fields_are_named_and_not_appended(entry, words):
    result = checks.dcgm_counters(CSV, [entry], "DCGM_FI_DEV_GPU_TEMP")
    (problem,) = result["problems"]
    assert problem.startswith("dcgm_exporter_extra_fields entry ")
    for word in words:
        assert word in problem, problem
    assert "DCGM_FI_DEV_FB_TOTAL" not in result["fields"]


def test_extra_fields_must_be_a_list():
    assert checks.dcgm_counters(CSV, {"field": "x"})["problems"] == [
        'dcgm_exporter_extra_fields must be a list of {field, type, help}, got {"field": "x"}']


def test_the_csv_must_be_text():
    with pytest.raises(checks.AnsibleFilterError, match="expects the text of the CSV"):
        checks.dcgm_counters(["DCGM_FI_DEV_GPU_TEMP, gauge, x"])


def test_the_roles_own_csv_is_valid():
    path = os.path.join(ROOT, "roles", "dcgm_exporter", "files", "hpcobs-counters.csv")
    with open(path, encoding="utf-8") as handle:
        result = checks.dcgm_counters(handle.read(), ready_metric="DCGM_FI_DEV_GPU_TEMP")
    assert result["problems"] == []
    assert len(result["fields"]) > 20


def test_the_filters_are_registered():
    assert set(checks.FilterModule().filters()) == {"hpcobs_file_target_problems", "hpcobs_loki_client_problems",
                                                    "hpcobs_log_label_problems", "hpcobs_dcgm_counters",
                                                    "hpcobs_roles_text_names", "hpcobs_control_char_problems",
                                                    "hpcobs_duration_seconds",
                                                    "hpcobs_sample_interval_problems"}


# Control characters in free-text settings (hpcobs_control_char_problems, hpcobs_roles_text_names)

def test_control_character_in_extra_args_names_variable_entry_and_position():
    found = checks.control_char_problems({"node_exporter_extra_args": ["--log.level=info", "--collector.x\nUser=root"]})
    assert found[0] == "node_exporter_extra_args[1] has a control character, line feed (U+000A), at position 14"
    assert "refused in every setting" in found[-1] and len(found) == 2


@pytest.mark.parametrize("char,name", [("\x00", "NUL"), ("\t", "tab"), ("\r", "carriage return"), ("\x1b", "escape"),
                                       ("\x7f", "delete"), ("\x01", "control"), ("\x1f", "control")])
def test_every_control_character_is_refused(char, name):
    found = checks.control_char_problems({"grafana_root_url": "https://g" + char + "x"})
    assert found[0].startswith("grafana_root_url has a control character, %s (U+%04X), at position 10"
                               % (name, ord(char)))


def test_grafana_ini_keys_and_values_are_checked():
    found = checks.control_char_problems({"grafana_ini": {"server": {"domain": "a\nadmin_password = x"},
                                                          "auth\n[x]": {"ok": "fine"}}})
    assert found[0] == 'grafana_ini["server"]["domain"] has a control character, line feed (U+000A), at position 2'
    assert found[1] == "a key of grafana_ini has a control character, line feed (U+000A), at position 5"
    assert len(found) == 3


def test_the_value_is_never_shown():
    found = checks.control_char_problems({"ipmi_exporter_remote_modules": {"m": {"pass": "pw-secret\x01x"}}})
    assert found[0] == ('ipmi_exporter_remote_modules["m"]["pass"] has a control character, control (U+0001), '
                        'at position 10')
    assert not any("pw-secret" in p for p in found)


def test_more_than_one_control_character_is_counted():
    found = checks.control_char_problems({"x_user": "a\nb\rc"})
    assert "at position 2 (and 1 more)" in found[0]


class _Unrenderable(dict):
    """A mapping whose entry is a template of a variable not defined yet, as Ansible's lazy containers give it."""
    def __getitem__(self, key):
        if key == "url_file":
            raise checks.UndefinedError("'alertmanager_secrets_dir' is undefined")
        return dict.__getitem__(self, key)


def test_an_entry_the_preflight_cannot_render_yet_is_skipped_and_the_others_checked():
    """A receiver written with a role default ("{{ alertmanager_secrets_dir }}/pager", as the alertmanager README
    shows) cannot be rendered before the roles run: the check skips that entry, not the setting."""
    receivers = [{"name": "pager\n", "webhook_configs": [_Unrenderable(url_file="{{ ... }}", send_resolved=True)]}]
    found = checks.control_char_problems({"alertmanager_receivers": receivers})
    assert found[0] == ('alertmanager_receivers[0]["name"] has a control character, line feed (U+000A), at position 6')
    assert len(found) == 2
    assert checks.control_char_problems({"alertmanager_receivers": [{"webhook_configs": [_Unrenderable(
        url_file="x")]}]}) == []


def test_clean_values_unset_and_non_text_pass():
    assert checks.control_char_problems({
        "node_exporter_extra_args": ["--collector.textfile", "--web.max-requests=40"],
        "grafana_ini": {"server": {"http_port": 3000, "enable_gzip": True, "domain": "grafana.site.example"}},
        "unset": checks.UNSET, "none": None, "number": 7,
        "unicode": "Müller · ドメイン", "space": "a b", "tilde": "~"}) == []


def test_text_names_cover_every_free_text_option_and_only_those():
    spec = """
argument_specs:
  main:
    options:
      x_extra_args: {type: list, elements: str}
      x_url: {type: str}
      x_dir: {type: path}
      x_labels: {type: dict}
      x_untyped: {description: str is the default type}
      x_native: {type: raw}
      x_port: {type: int}
      x_ratio: {type: float}
      x_enabled: {type: bool}
      alertmanager_receivers: {type: list, elements: dict}
"""
    names = checks.text_names([("x", spec), ("service", "argument_specs: {main: {options: {service_exec: {}}}}")])
    assert set(names) == {"x_extra_args", "x_url", "x_dir", "x_labels", "x_untyped", "x_native"} | set(
        checks.GLOBAL_TEXT)
    assert checks.text_names([("x", spec), ("y", spec.replace("x_", "y_"))], role="y") == sorted(
        ["y_extra_args", "y_url", "y_dir", "y_labels", "y_untyped", "y_native"])


def test_text_names_of_the_real_roles():
    names = checks.roles_text_names(os.path.join(ROOT, "roles"))
    extra_args = [n for n in names if n.endswith("_extra_args")]
    assert len(extra_args) >= 7 and "grafana_ini" in names and "ipmi_exporter_remote_modules" in names
    assert "node_exporter_ready_timeout" not in names and "service_exec" not in names
    assert not set(checks.CONTROL_EXEMPT) & set(names)
    assert checks.roles_text_names(os.path.join(ROOT, "roles"), "node_exporter") == sorted(
        n for n in names if n.startswith("node_exporter_"))


def test_every_exempt_option_is_a_real_option_with_a_reason():
    for option, reason in checks.CONTROL_EXEMPT.items():
        role = "victoriametrics" if option.startswith("victoriametrics") else option.split("_")[0]
        with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
            assert "\n      %s:\n" % option in handle.read(), option
        assert reason


def test_with_the_security_switch_every_loki_url_is_https():
    assert checks.loki_client_problems(["https://mgmt01:3100"], "", "promtail", True) == []
    assert checks.loki_client_problems(["http://mgmt01:3100"], "", "promtail", False) == []
    (problem,) = checks.loki_client_problems(["https://m1:3100", "http://m2:3100"], "", "promtail", "True")
    assert "hpcobs_security is on" in problem and "promtail_loki_urls" in problem


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("1m", 60), ("1m30s", 90), ("2h", 7200), ("500ms", 0.5),
                                          ("1d", 86400), ("1w", 604800)])
def test_durations_in_seconds(text, seconds):
    assert checks.duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "1.5m", "m", "30 s", "-1m", 30, None, "1m30"])
def test_a_bad_duration_is_named(text):
    with pytest.raises(checks.AnsibleFilterError, match="not a duration"):
        checks.duration_seconds(text)


# The GPU sample interval (hpcobs_sample_interval_problems)

def test_one_sample_interval_on_every_host_is_accepted():
    assert checks.sample_interval_problems({"gpu01": "30s", "gpu02": "30s", "mgmt01": "30s"}) == []
    # the same duration written two ways is one interval
    assert checks.sample_interval_problems({"gpu01": "1m", "mgmt01": "60s"}) == []


def test_a_sample_interval_that_differs_between_hosts_is_named():
    hosts = {"gpu%02d" % i: "15s" for i in range(1, 6)}
    hosts["mgmt01"] = "30s"
    (problem,) = checks.sample_interval_problems(hosts)
    assert "differs between hosts" in problem and "group_vars/all" in problem
    assert "15s on gpu01, gpu02, gpu03 and 2 more" in problem and "30s on mgmt01" in problem


@pytest.mark.parametrize("value,words", [("30", "a duration like 30s"), (30, "a duration like 30s"),
                                         ("500ms", "from 1s to 5m"), ("10m", "from 1s to 5m")])
def test_a_bad_sample_interval_is_named_with_its_host(value, words):
    (problem,) = checks.sample_interval_problems({"gpu01": value})
    assert problem.startswith("hpcobs_gpu_sample_interval on gpu01 must be") and words in problem
