"""Unit tests of roles/loki/filter_plugins/hpcobs_logql.py: the strict LogQL parser and the rule checks.

Loki's ruler loads no rule group of a tenant when one expression does not parse, and an alert written as a log query
never fires, so the role must refuse both before anything changes. The expressions below are Loki 3.x LogQL (the
refused ones with the reason Loki gives, from pkg/logql/syntax).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "hpcobs_logql", REPO / "roles" / "loki" / "filter_plugins" / "hpcobs_logql.py")
logql = importlib.util.module_from_spec(spec)
spec.loader.exec_module(logql)

XID = ('sum by (node, pci, xid) (count_over_time({transport="kernel"} |= "NVRM: Xid" '
       '| regexp `NVRM: Xid \\((?:PCI:)?(?P<pci>[^)]+)\\):\\s*(?P<xid>\\d+)` | xid =~ "48|63|64|74|79|94|95" [5m])) > 0')

METRIC = [
    XID,
    'rate({job="slurm"}[5m])',
    'count_over_time({job="slurm"}[5m] |= "error")',
    'sum(rate({job="a"} | json | level="error" [1m])) by (node) / sum(rate({job="a"}[1m])) by (node) > 0.1',
    'quantile_over_time(0.99, {job="a"} | logfmt --strict | unwrap duration(latency) | __error__="" [5m]) by (node)',
    'topk(3, sum by (unit) (count_over_time({node=~".+"} |~ "(?i)oom" or "killed" [10m])))',
    'count_over_time({job="a"}[5m]) > 1 and on(node) count_over_time({job="b"}[5m])',
    'absent_over_time({job="x"}[10m])',
    'sum(count_over_time({a="b"} | pattern `<ip> - <_>` | ip = ip("10.0.0.0/8") [5m]))',
    'bytes_rate({a="b"} | label_format x=y, z="{{.a}}" | line_format "{{.x}}" | drop x, y="1" | keep a [1m] offset 5m)',
    'sum by (node) (count_over_time({unit="slurmd.service"} | logfmt | status >= 500 and duration > 1s [5m]))',
    'label_replace(rate({a="b"}[1m]), "dst", "$1", "src", "(.*)")',
    'max_over_time({a="b"} | unwrap bytes(size) [5m]) by (node) > 1e6',
    'sum without (pid) (count_over_time({a="b"} != "debug" [5m])) > bool 0',
    'sort_desc(sum(count_over_time({a="b"}[5m])))',
    'vector(1)',
    '1 + 2',
]

LOG = ['{unit="kernel"} |= "Out of memory"', '{a="b"}', '{a="b", c!="d"} | json | line_format "{{.msg}}"']

INVALID = {
    # the unbalanced parenthesis of a site rule that took every group of a real Loki down
    'sum by (node) (count_over_time({transport="kernel"} |= "Out of memory" [5m]) > 0': "expecting ')'",
    '{a="b"': "expecting ',' or '}'",
    'count_over_time({a="b"})': "expecting a range",
    'sum({a="b"})': "aggregates metric queries",
    '{a=~".*"}': "at least one regexp or equality matcher",
    '{a!="b"}': "at least one regexp or equality matcher",
    'count_over_time({a="b"} | regexp "(x)" [5m])': "at least one named capture",
    'count_over_time({a="b"} | pattern "plain" [5m])': "at least one capture",
    'rate({a="b"} |~ "(" [5m])': "invalid regex",
    'rate({a="b"} |~ "(?=x)" [5m])': "not supported (RE2)",
    '{a="b"} |= "x" [5m]': "belongs inside a range aggregation",
    'foo(1)': "not a LogQL function",
    'up == 0': "not a LogQL function",
    'count_over_time({a="b"} | unwrap x [5m])': "invalid aggregation count_over_time with unwrap",
    'sum_over_time({a="b"}[5m])': "invalid aggregation sum_over_time without unwrap",
    'count_over_time({a="b"}[5m]) by (x)': "grouping not allowed for count_over_time",
    '{a="b"} > 1': "a log query cannot be the left side",
    'count_over_time({a="b"} | jsn [5m])': "expecting a label filter operator",
    'rate({a="b"}[5x])': "unexpected",
    'count_over_time({a="b"} |= "x" | unwrap y [5m])': "invalid aggregation count_over_time with unwrap",
    '{a="b"} | unwrap x': "only allowed in a range aggregation",
    'topk(sum(rate({a="b"}[1m])))': "expecting the number of series",
    '': "empty expression",
    'count_over_time({a="b"}[5m]) and 1': "needs metric queries on both sides",
    '{a="b" |= "x"}': "unexpected",
}


@pytest.mark.parametrize("expr", METRIC)
def test_metric_queries_parse(expr):
    assert logql.logql_kind(expr) == "metric"


@pytest.mark.parametrize("expr", LOG)
def test_log_queries_parse_as_log(expr):
    assert logql.logql_kind(expr) == "log"


@pytest.mark.parametrize("expr", sorted(INVALID))
def test_invalid_expressions_are_refused(expr):
    with pytest.raises(logql.LogQLError) as err:
        logql.logql_kind(expr)
    assert INVALID[expr] in str(err.value)


def test_errors_carry_the_column():
    with pytest.raises(logql.LogQLError, match=r"^parse error at line 1, col 16: "):
        logql.logql_kind('rate({a="b"} | [5m])')


def rule(**changes):
    base = {"alert": "SiteOom", "expr": 'sum by (node) (count_over_time({unit="kernel"} |= "oom" [5m])) > 0',
            "labels": {"severity": "warning", "audience": "ops"},
            "annotations": {"summary": "s", "description": "d", "runbook": "r"}}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def test_good_rules_have_no_problem():
    assert logql.loki_rule_problems([{"name": "site", "rules": [rule()]},
                                     {"name": "rec", "interval": "1m",
                                      "rules": [{"record": "node:oom:count5m", "expr": rule()["expr"]}]}]) == []


@pytest.mark.parametrize("groups,problem", [
    ([{"name": "g", "rules": [rule(expr='{unit="kernel"} |= "oom"')]}], "g/SiteOom: expr is a log query"),
    ([{"name": "g", "rules": [rule(expr="up == 0")]}], "g/SiteOom: expr is not valid LogQL (parse error"),
    ([{"name": "g", "rules": [rule(expr=None)]}], "g/SiteOom: expr is not valid LogQL"),
    ([{"name": "g", "rules": [rule(labels={"severity": "page", "audience": "ops"})]}],
     "g/SiteOom: severity must be critical, warning or info"),
    ([{"name": "g", "rules": [rule(labels={"severity": "info", "audience": "x"})]}], "audience must be"),
    ([{"name": "g", "rules": [rule(annotations={"summary": "s", "description": "d"})]}],
     "g/SiteOom: annotation runbook missing"),
    ([{"name": "g", "rules": [rule(record="x")]}], "needs exactly one of alert and record"),
    ([{"name": "g", "rules": [rule(**{"for": "5 minutes"})]}], "for '5 minutes' is not a duration"),
    ([{"name": "g", "rules": [rule(fro="5m")]}], "g/SiteOom: unknown key fro"),
    ([{"name": "g", "rules": [rule(alert="Bad-Name")]}], "invalid alert name"),
    ([{"name": "g", "rules": [rule(labels={"bad-label": "x", "severity": "info", "audience": "ops"})]}],
     "labels must map label names"),
    ([{"name": "g", "rules": []}], "group g: no rules"),
    ([{"name": "g g", "rules": [rule()]}], 'group "g g": name must match'),
    ([{"name": "g", "rules": [rule()]}, {"name": "g", "rules": [rule()]}], "group g: name used twice"),
    ([{"name": "g", "rulez": [], "rules": [rule()]}], "group g: unknown key rulez"),
    ([{"name": "g", "rules": [{"record": "bad name", "expr": rule()["expr"]}]}], "invalid recording rule name"),
    ("g", "must be a list"),
])
def test_rule_problems(groups, problem):
    problems = logql.loki_rule_problems(groups)
    assert any(problem in p for p in problems), problems


def test_one_broken_rule_among_good_ones_is_reported_alone():
    groups = [{"name": "hpcobs-kernel-log", "rules": [rule(expr=XID, alert="Xid")]},
              {"name": "site", "rules": [rule(), rule(alert="Broken", expr=XID[:-5])]}]
    (problem,) = logql.loki_rule_problems(groups)
    assert problem.startswith("site/Broken: expr is not valid LogQL")


def test_the_filter_fails_a_task_on_an_invalid_expression():
    assert logql.loki_logql_kind(XID) == "metric"
    with pytest.raises(logql.AnsibleFilterError):
        logql.loki_logql_kind("up == 0")
    assert set(logql.FilterModule().filters()) == {"loki_rule_problems", "loki_logql_kind"}
