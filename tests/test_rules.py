"""Unit tests of the vmalert role's alerting and recording rules.

The rule files are rendered by the role's own task file (roles/vmalert/tasks/rules.yml, through
tests/playbooks/render_vmalert_rules.yml) with the role's rule defaults, validated by the real
`vmalert -dryRun` (the same `validate:` the role uses) and then exercised by the real
`vmalert-tool unittest`, one pytest test per tests/rules/*.test.yml.

Test files are plain vmalert-tool unittest files with two conveniences:
- `rule_files` name rendered files by their base name (e.g. hpcobs-gpu.yml); they are resolved to the
  rendered directory here;
- an expected alert may omit annotations whose text has no Go template (description, runbook): they are
  constants of the rule and are copied from the rendered rule. Templated ones (summary) must be spelled out;
- input series are what the exporters serve: dcgm-exporter fields outside the shared gpu_job_fields lose `hpc_job`
  here, as the victoriametrics role's dcgm job removes it at scrape time (copies of one GPU's field that become one
  series must have the same values, as a real GPU's have).

Tools: HPCOBS_TOOLS_BIN (a directory) if set, else <repo>/.cache/tools/bin, else PATH. A missing tool fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tooling import PROJECT_FILTERS, tool

sys.path.insert(0, str(PROJECT_FILTERS))
import hpcobs_service  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RULE_TESTS_DIR = REPO / "tests" / "rules"
RENDER_PLAYBOOK = REPO / "tests" / "playbooks" / "render_vmalert_rules.yml"
RULE_DEFAULTS = REPO / "roles" / "vmalert" / "defaults" / "main" / "rules.yml"
ALERTS_DOC = REPO / "docs" / "alerts.md"
RULE_TEST_FILES = sorted(RULE_TESTS_DIR.glob("*.test.yml"))

# Variables of the unit-test rendering, on top of the role defaults: budgets for two accounts (the shipped
# default is empty, which renders no budget alert at all).
TEST_VARS = {"vmalert_energy_budget_kwh_per_day": {"physics": 50, "chemistry": 2.5}}
# A rendering with unusual but valid settings, only validated and inspected.
VARIANT_VARS = {
    "vmalert_alert_for_overrides": {"HpcobsGpuHungJob": "7m", "HpcobsGpuTemperatureCritical": "30s"},
    "vmalert_gpu_temp_critical_celsius_by_model": {},
    "vmalert_gpu_xid_ignore_codes": [43, 45],
    "vmalert_energy_budget_kwh_per_day": {"physics": 10},
}

SEVERITIES = {"critical", "warning", "info"}
AUDIENCES = {"oncall", "team", "ops"}
RECORD_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")
YAMLLINT_CONFIG = "extends: default\nrules:\n  line-length:\n    max: 160\n"


# --------------------------------------------------------------------------------------------------- tools


def ansible_playbook() -> Path:
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.is_file():
        return beside
    found = shutil.which("ansible-playbook")
    if found:
        return Path(found)
    pytest.fail("ansible-playbook not found (next to the Python running pytest, or on PATH)")


# ----------------------------------------------------------------------------------------------- rendering
def render(dest: Path, extra_vars: dict) -> subprocess.CompletedProcess:
    """Run the render playbook into dest; fail with its output on error."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
    validate = f"{tool('vmalert')} -dryRun -loggerLevel=ERROR -rule=%s"
    cmd = [
        str(ansible_playbook()),
        "-i",
        "localhost,",
        str(RENDER_PLAYBOOK),
        "-e",
        json.dumps({"vmalert_rules_dir": str(dest), "vmalert_rules_validate_command": validate, **extra_vars}),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"rendering the rules failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def recap_changed(output: str) -> int:
    m = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", output)
    assert m, f"no play recap in:\n{output}"
    return int(m.group(1))


def load_groups(rules_dir: Path) -> dict[str, list[dict]]:
    """{file name: [group, ...]} of the rendered rule files."""
    out = {}
    for path in sorted(rules_dir.glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        out[path.name] = doc["groups"]
    return out


def all_rules(groups_by_file: dict[str, list[dict]]):
    for fname, groups in groups_by_file.items():
        for group in groups:
            for rule in group["rules"]:
                yield fname, group["name"], rule


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """Rules rendered for the unit tests, twice into the same directory, with files to prune or keep."""
    dest = tmp_path_factory.mktemp("rules")
    (dest / "hpcobs-obsolete.yml").write_text("groups: []\n")
    (dest / "site-local.yml").write_text("groups: []\n")
    first = render(dest, TEST_VARS)
    second = render(dest, TEST_VARS)
    return {"dir": dest, "first": first.stdout, "second": second.stdout, "groups": load_groups(dest)}


@pytest.fixture(scope="session")
def rendered_default(tmp_path_factory):
    dest = tmp_path_factory.mktemp("rules-default")
    render(dest, {})
    return {"dir": dest, "groups": load_groups(dest)}


@pytest.fixture(scope="session")
def rendered_variant(tmp_path_factory):
    dest = tmp_path_factory.mktemp("rules-variant")
    render(dest, VARIANT_VARS)
    return {"dir": dest, "groups": load_groups(dest)}


# ------------------------------------------------------------------------------------- rendering and files
def test_render_is_idempotent_and_prunes_only_its_own_files(rendered):
    names = {p.name for p in rendered["dir"].iterdir()}
    templates = {p.name[: -len(".j2")] for p in (REPO / "roles/vmalert/templates/rules").glob("*.yml.j2")}
    assert templates <= names
    assert "hpcobs-obsolete.yml" not in names, "a stale rule file of the role was not removed"
    assert "site-local.yml" in names, "a rule file the role does not own was removed"
    assert recap_changed(rendered["first"]) > 0
    assert recap_changed(rendered["second"]) == 0, f"second run changed something:\n{rendered['second']}"
    for path in rendered["dir"].glob("hpcobs-*.yml"):
        assert path.stat().st_mode & 0o777 == 0o644, path


@pytest.mark.parametrize("which", ["rendered", "rendered_default", "rendered_variant"])
def test_rule_files_pass_vmalert_dry_run(which, request):
    rules_dir = request.getfixturevalue(which)["dir"]
    proc = subprocess.run(
        [str(tool("vmalert")), "-dryRun", "-loggerLevel=ERROR", f"-rule={rules_dir}/hpcobs-*.yml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("which", ["rendered", "rendered_default", "rendered_variant"])
def test_rule_files_pass_yamllint(which, request):
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    conf = YamlLintConfig(YAMLLINT_CONFIG)
    problems = []
    for path in sorted(request.getfixturevalue(which)["dir"].glob("hpcobs-*.yml")):
        problems += [f"{path.name}:{p.line}:{p.column} {p.message}" for p in linter.run(path.read_text(), conf)]
    assert not problems, "\n".join(problems)


def test_rule_test_files_pass_yamllint():
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    conf = YamlLintConfig(YAMLLINT_CONFIG)
    problems = []
    for path in RULE_TEST_FILES:
        problems += [f"{path.name}:{p.line}:{p.column} {p.message}" for p in linter.run(path.read_text(), conf)]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------- conventions
def test_alerts_follow_the_conventions(rendered):
    defaults = yaml.safe_load(RULE_DEFAULTS.read_text())
    alerts = {}
    for fname, group, rule in all_rules(rendered["groups"]):
        if "alert" not in rule:
            continue
        name = rule["alert"]
        where = f"{fname}/{group}/{name}"
        assert name not in alerts, f"alert {name} defined twice"
        alerts[name] = rule
        assert name.startswith("Hpcobs"), where
        assert rule.get("for") == defaults["vmalert_alert_for"].get(name), f"{where}: `for` not from vmalert_alert_for"
        labels = rule.get("labels", {})
        assert labels.get("severity") in SEVERITIES, where
        assert labels.get("audience") in AUDIENCES, where
        if labels["audience"] == "oncall":
            assert labels["severity"] == "critical", f"{where}: only critical alerts page"
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            assert str(ann.get(key, "")).strip(), f"{where}: annotation {key} missing"
        if name.startswith("HpcobsGpu") and name != "HpcobsGpuMissing":
            # Every alert about a GPU attaches the job holding it: the owner record, which joins
            # hpcobs_slurm_job_info, and nothing that redoes that join per alert.
            assert "gpu:hpcobs_gpu_owner:info" in rule["expr"], f"{where}: no job attribution"
            assert "hpcobs_slurm_job_info" not in rule["expr"], f"{where}: joins the job info itself"
            assert "$labels.hpc_job" in ann["summary"], f"{where}: summary does not name the job"
    assert set(alerts) == set(defaults["vmalert_alert_for"]), "vmalert_alert_for and the alerts differ"
    owners = [rule for _, group, rule in all_rules(rendered["groups"]) if rule.get("record") == "gpu:hpcobs_gpu_owner:info"]
    assert len(owners) == 1 and "hpcobs_slurm_job_info" in owners[0]["expr"]


def test_recording_rules_follow_the_naming_convention(rendered):
    names = [rule["record"] for _, _, rule in all_rules(rendered["groups"]) if "record" in rule]
    assert names, "no recording rule rendered"
    assert len(names) == len(set(names)), "a recording rule is defined twice"
    for name in names:
        assert RECORD_NAME.match(name), f"{name} does not follow level:metric:operations"


def test_budget_alert_renders_only_with_budgets(rendered, rendered_default):
    def names(r):
        return {rule.get("alert") for _, _, rule in all_rules(r["groups"])}

    assert "HpcobsAccountEnergyBudgetExceeded" in names(rendered)
    assert "HpcobsAccountEnergyBudgetExceeded" not in names(rendered_default)
    assert names(rendered) - names(rendered_default) == {"HpcobsAccountEnergyBudgetExceeded"}


def test_variant_rendering_applies_the_variables(rendered_variant):
    rules = {rule.get("alert"): rule for _, _, rule in all_rules(rendered_variant["groups"])}
    assert rules["HpcobsGpuHungJob"]["for"] == "7m"
    assert rules["HpcobsGpuTemperatureCritical"]["for"] == "30s"
    assert rules["HpcobsGpuThermalThrottling"]["for"] == "10m"
    # no per-model threshold left: one comparison with the default
    assert "modelName=" not in rules["HpcobsGpuTemperatureCritical"]["expr"]
    assert "modelName!=" not in rules["HpcobsGpuTemperatureCritical"]["expr"]
    assert re.search(r"!= 43\s+!= 45", rules["HpcobsGpuXidError"]["expr"])
    assert '"physics"' in rules["HpcobsAccountEnergyBudgetExceeded"]["expr"]


# ----------------------------------------------------------------------------------------------- coverage
def load_test_file(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_every_rule_has_unit_tests(rendered):
    fired, silent, recorded = set(), set(), set()
    exprs = []
    for path in RULE_TEST_FILES:
        for group in load_test_file(path).get("tests", []):
            for case in group.get("alert_rule_test", []) or []:
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
            for case in group.get("metricsql_expr_test", []) or []:
                if case.get("exp_samples"):
                    exprs.append(case["expr"])
    for expr in exprs:
        recorded.update(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*", expr))
    missing = []
    for _, _, rule in all_rules(rendered["groups"]):
        if "alert" in rule:
            if rule["alert"] not in fired:
                missing.append(f"alert {rule['alert']}: no test where it fires")
            if rule["alert"] not in silent:
                missing.append(f"alert {rule['alert']}: no test where it stays silent")
        elif rule["record"] not in recorded:
            missing.append(f"recording rule {rule['record']}: no metricsql_expr_test with expected samples")
    assert not missing, "\n".join(missing)


def test_docs_describe_every_rule(rendered):
    doc = ALERTS_DOC.read_text()
    missing = [
        rule.get("alert") or rule["record"]
        for _, _, rule in all_rules(rendered["groups"])
        if f"`{rule.get('alert') or rule['record']}`" not in doc
    ]
    assert not missing, f"docs/alerts.md does not describe: {', '.join(missing)}"
    for path in RULE_TEST_FILES:
        assert path.name in doc, f"docs/alerts.md does not mention {path.name}"


# ------------------------------------------------------------------------------------------- unit tests
SERIES = re.compile(r'^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{(.*)\}\s*$', re.S)
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def as_stored(test_file: Path, series: list[dict]) -> list[dict]:
    """Input series as VictoriaMetrics stores them: the dcgm job's relabelling (hpc_job kept on the shared
    gpu_job_fields only) applied to the DCGM fields; copies that become one series are merged (their values must
    agree)."""
    kept = set(hpcobs_service.shared_fact("gpu_job_fields"))
    out, seen = [], {}
    for entry in series:
        match = SERIES.match(entry["series"])
        if not match or not match.group(1).startswith("DCGM_FI_") or match.group(1) in kept:
            out.append(entry)
            continue
        body = match.group(2)
        labels = LABEL.findall(body)
        assert "".join(m.group(0) for m in LABEL.finditer(body)).strip() == body.strip().rstrip(","), \
            f"{test_file.name}: cannot read the labels of {entry['series']!r}"
        labels = [(k, v) for k, v in labels if k != "hpc_job"]
        text = "%s{%s}" % (match.group(1), ", ".join('%s="%s"' % kv for kv in labels))
        key = (match.group(1), tuple(sorted(labels)))
        if key in seen:
            first = seen[key]
            try:
                first["values"] = merge_values(first["values"], entry["values"])
            except ValueError as exc:
                raise AssertionError(f"{test_file.name}: {text} is stored once per GPU (no hpc_job on it), but its "
                                     f"job copies disagree: {exc}") from None
            continue
        seen[key] = dict(entry, series=text)
        out.append(seen[key])
    return out


def expand_values(text) -> list:
    """A vmalert-tool (promtool) values string as a list: floats, None for a missing sample, "stale"."""
    out = []
    for token in str(text).split():
        if token == "stale":
            out.append("stale")
            continue
        if token == "_":
            out.append(None)
            continue
        found = re.fullmatch(r"_x(\d+)", token)
        if found:
            out.extend([None] * int(found.group(1)))
            continue
        found = re.fullmatch(r"([-+]?[0-9.eE+-]+?)(?:([-+])([0-9.eE+-]+))?x(\d+)", token)
        if found:
            start, sign, step, count = found.groups()
            step = float(step or 0) * (-1 if sign == "-" else 1)
            out.extend(float(start) + k * step for k in range(int(count) + 1))
            continue
        out.append(float(token))
    return out


def merge_values(first, second) -> str:
    """Two job copies of one GPU's field as the one series the store keeps: at each step a sample wins over a stale
    marker, a stale marker over a missing sample; two different samples at one step are refused.

    A copy that had a sample at the step before and has none at this step while the other has one is a job change on
    the GPU: VictoriaMetrics' scrape compares the text of two scrapes before relabelling, finds the copy's line gone
    and stores a stale marker at the new scrape's timestamp, beside the new copy's sample. An instant read then sees
    the marker until the next scrape, a range function drops it and keeps the sample; this file can hold one value
    per step, so the step becomes the marker (an instant read is exact, a range read loses that one sample)."""
    a, b = expand_values(first), expand_values(second)
    merged = []
    for k in range(max(len(a), len(b))):
        x = a[k] if k < len(a) else None
        y = b[k] if k < len(b) else None
        if isinstance(x, float) and isinstance(y, float) and x != y:
            raise ValueError("step %d has %s and %s (%r, %r)" % (k, x, y, first, second))
        gone = any(0 < k <= len(c) and isinstance(c[k - 1], float) and not (k < len(c) and isinstance(c[k], float))
                   for c in (a, b))
        if isinstance(x, float) or isinstance(y, float):
            merged.append("stale" if gone else x if isinstance(x, float) else y)
        else:
            merged.append(x if x == "stale" else y)
    return " ".join("_" if v is None else v if v == "stale" else repr(v) for v in merged)


def prepare(test_file: Path, rendered: dict, out_dir: Path) -> Path:
    """Write the vmalert-tool file: rule files resolved, constant annotations filled in, input series as stored."""
    doc = load_test_file(test_file)
    for group in doc.get("tests", []):
        if group.get("input_series"):
            group["input_series"] = as_stored(test_file, group["input_series"])
    rule_files = doc.get("rule_files") or []
    assert rule_files, f"{test_file.name}: no rule_files"
    resolved = []
    for name in rule_files:
        path = rendered["dir"] / name
        assert path.is_file(), f"{test_file.name}: rule file {name} is not rendered"
        resolved.append(str(path))
    doc["rule_files"] = resolved

    rules = {}
    for name in rule_files:
        for group in rendered["groups"][name]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[(group["name"], rule["alert"])] = rule
    for group in doc.get("tests", []):
        for case in group.get("alert_rule_test", []) or []:
            key = (case.get("groupname"), case["alertname"])
            assert key in rules, f"{test_file.name}: no alert {key[1]} in group {key[0]}"
            constant = {k: v for k, v in rules[key].get("annotations", {}).items() if "{{" not in str(v)}
            for exp in case.get("exp_alerts") or []:
                annotations = exp.setdefault("exp_annotations", {})
                for key_, value in constant.items():
                    annotations.setdefault(key_, value)
    out = out_dir / test_file.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000))
    return out


@pytest.mark.parametrize("test_file", RULE_TEST_FILES, ids=[p.name for p in RULE_TEST_FILES])
def test_rules_unit(test_file, rendered, tmp_path):
    prepared = prepare(test_file, rendered, tmp_path)
    env = dict(os.environ, TMPDIR=str(tmp_path))  # vmalert-tool keeps its storage under $TMPDIR
    proc = subprocess.run(
        [str(tool("vmalert-tool")), "unittest", f"--files={prepared}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SUCCESS" in output and "FAILED" not in output, output


def test_rule_test_files_exist():
    assert RULE_TEST_FILES, f"no *.test.yml in {RULE_TESTS_DIR}"


def test_job_copies_merge_into_the_stored_series():
    assert expand_values("-2+4x3 _x2 stale 1e3") == [-2.0, 2.0, 6.0, 10.0, None, None, "stale", 1000.0]
    # a job's copy goes stale and the next job's starts: the stored field runs on, with the stale marker of the
    # scrape that saw the change
    assert merge_values("31x2 stale", "_x3 31x1") == "31.0 31.0 31.0 stale 31.0"
    # a job joins a GPU another job keeps: no line went, no marker
    assert merge_values("31x3", "_ _ 31x1") == "31.0 31.0 31.0 31.0"
    # a job ends on a GPU that another job keeps: its line went
    assert merge_values("31x3", "31x1") == "31.0 31.0 stale 31.0"
    assert merge_values("_ stale", "_ _ 2") == "_ stale 2.0"
    with pytest.raises(ValueError, match="step 1"):
        merge_values("1 2", "1 3")
    series = [{"series": 'DCGM_FI_DEV_XID_ERRORS{gpu="0", hpc_job="1"}', "values": "0x1 stale"},
              {"series": 'DCGM_FI_DEV_XID_ERRORS{gpu="0", hpc_job="2"}', "values": "_x2 79"},
              {"series": 'DCGM_FI_DEV_GPU_TEMP{gpu="0", hpc_job="2"}', "values": "40"},
              {"series": 'up{job="dcgm", hpc_job="2"}', "values": "1"}]
    assert as_stored(Path("x.test.yml"), series) == [
        {"series": 'DCGM_FI_DEV_XID_ERRORS{gpu="0"}', "values": "0.0 0.0 stale"}] + series[2:]


def test_fields_without_the_job_label_are_read_across_a_job_change(rendered):
    """A GPU field stored without hpc_job carries a stale marker for one scrape at each job change on its GPU (the
    store's model: merge_values): every rule reads it through a range function (gpu_field in hpcobs-gpu.yml.j2), never
    as an instant value that would lose the GPU for that scrape and reset its alerts."""
    kept = set(hpcobs_service.shared_fact("gpu_job_fields"))
    read, instant = set(), []
    for name, groups in rendered["groups"].items():
        for group in groups:
            for rule in group["rules"]:
                for found in re.finditer(r"(DCGM_FI_[A-Z0-9_]+)(\{[^}]*\})?\s*(\[)?", rule["expr"]):
                    if found.group(1) in kept:
                        continue
                    read.add(found.group(1))
                    if not found.group(3):
                        instant.append("%s %s: %s" % (name, rule.get("alert") or rule.get("record"), found.group(0)))
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS"} <= read, sorted(read)
    assert not instant, "read as an instant value: %s" % instant
