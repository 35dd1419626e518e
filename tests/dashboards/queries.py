#!/usr/bin/env python3
"""Every panel query of the dashboards the grafana role provisions, evaluated against a real VictoriaMetrics.

A dashboard that loads fine can still show "No data" everywhere: a misspelt metric or label, a recording rule that was
renamed, a template variable that matches nothing. This module finds every query of every panel (rows, collapsed rows
and their nested panels included), substitutes the template variables with concrete values (resolved against the same
VictoriaMetrics, the way Grafana would fill the drop-downs, or given by the caller) and Grafana's built-in variables
($__rate_interval, $__range, ...), runs each query the way its panel does (instant or range over the dashboard's time
range) and reports the ones that return nothing or fail.

Library use (pytest, the Molecule scenarios):

    import queries                                       # tests/dashboards on sys.path
    problems = queries.check("http://mgmt01:8428")       # [] when every query returned data
    problems = queries.check(url, overrides={"account": "physics", "job": "1001"})

    for q in queries.all_queries():                      # static: no VictoriaMetrics needed
        ...                                              # q.dashboard_uid, q.panel_title, q.expr, q.instant

Command line:

    python3 tests/dashboards/queries.py --vm http://127.0.0.1:8428 [--var account=physics] [--list]

Standard library only (runs on the controller or on a test host with the distribution python3).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "roles" / "grafana" / "files" / "dashboards"

# Defaults for Grafana's built-in interval variables. $__rate_interval is at least four scrape intervals; the
# provisioned datasource declares a 15 s scrape interval, Grafana then uses 1m for most panel widths.
DEFAULT_RATE_INTERVAL = "1m"
DEFAULT_INTERVAL = "15s"
# Points per range query (Grafana asks for about one per pixel of the panel width; the step never goes below 15 s).
MAX_POINTS = 1500
MIN_STEP = 15

_VAR = re.compile(r"\$\{(?P<braced>[A-Za-z0-9_]+)(?::(?P<fmt>[A-Za-z0-9_]+))?\}|\[\[(?P<old>[A-Za-z0-9_]+)\]\]"
                  r"|\$(?P<plain>[A-Za-z0-9_]+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$",
                           re.S)
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# Characters Grafana escapes in a multi-value or "All" variable used inside a Prometheus regex matcher.
_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


class HarnessError(Exception):
    """The dashboard itself cannot be evaluated (unknown variable, unsupported variable query)."""


@dataclass(frozen=True)
class PanelQuery:
    """One target (query) of one panel."""

    dashboard_file: str
    dashboard_uid: str
    dashboard_title: str
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    instant: bool
    datasource_uid: str

    @property
    def id(self) -> str:
        return "%s/%s/%s" % (self.dashboard_uid, self.panel_title, self.ref_id)

    def __str__(self) -> str:
        return self.id


@dataclass
class Evaluation:
    query: PanelQuery
    rendered: str
    series: int = 0
    points: int = 0
    error: str = ""
    values: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.error and self.points > 0

    def describe(self) -> str:
        what = ("error: %s" % self.error) if self.error else "returned no data" if not self.points else \
            "%d series" % self.series
        return "%s [%s] %s\n    %s" % (self.query.id, "instant" if self.query.instant else "range", what,
                                      self.rendered)


# --------------------------------------------------------------------------------------------- reading dashboards
def load_dashboards(paths=None) -> dict[str, dict]:
    """{file name: dashboard model} of the given files, default every *.json the role provisions."""
    files = [Path(p) for p in paths] if paths else sorted(DASHBOARD_DIR.glob("*.json"))
    if not files:
        raise HarnessError("no dashboard files found in %s" % DASHBOARD_DIR)
    return {f.name: json.loads(f.read_text(encoding="utf-8")) for f in files}


def iter_panels(container):
    """Every panel below a dashboard (or a row): rows are walked, collapsed rows' nested panels included."""
    for panel in container.get("panels") or []:
        if panel.get("type") == "row":
            yield from iter_panels(panel)
            continue
        yield panel
        # library panels and panel groups may nest further
        if panel.get("panels"):
            yield from iter_panels(panel)


def iter_rows(container):
    for panel in container.get("panels") or []:
        if panel.get("type") == "row":
            yield panel


def _uid(datasource) -> str:
    if isinstance(datasource, dict):
        return str(datasource.get("uid") or "")
    return str(datasource or "")


def panel_queries(model: dict, file_name: str = "") -> list[PanelQuery]:
    """The PromQL targets of every panel of one dashboard."""
    out = []
    for panel in iter_panels(model):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if not expr:
                continue
            out.append(PanelQuery(
                dashboard_file=file_name, dashboard_uid=model.get("uid", ""), dashboard_title=model.get("title", ""),
                panel_id=panel.get("id", 0), panel_title=panel.get("title", ""), ref_id=target.get("refId", ""),
                expr=expr, instant=bool(target.get("instant")) and not target.get("range", False),
                datasource_uid=_uid(target.get("datasource") or panel.get("datasource"))))
    return out


def all_queries(paths=None) -> list[PanelQuery]:
    """Every panel query of every dashboard the role provisions (or of the given files)."""
    out = []
    for name, model in load_dashboards(paths).items():
        out.extend(panel_queries(model, name))
    return out


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
             "inf", "nan", "atan2", "keep_metric_names"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL/MetricsQL expression reads (selectors only; functions, keywords, labels excluded)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    text = re.sub(r"\$\{?[A-Za-z0-9_]+\}?", " ", text)
    text = re.sub(r"(?<![A-Za-z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|s|m|h|d|w|y)?", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group(0) in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names


# ------------------------------------------------------------------------------------------------ time and values
def seconds(duration: str) -> float:
    total, rest = 0.0, duration.strip()
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", rest):
        total += int(number) * _UNITS[unit]
    if not total or re.sub(r"(\d+)(ms|s|m|h|d|w|y)", "", rest):
        raise HarnessError("cannot read the duration %r" % duration)
    return total


def range_seconds(model: dict) -> float:
    """Length of the dashboard's default time range (only "now-<duration>" to "now" ranges are used here)."""
    time_range = model.get("time") or {"from": "now-6h", "to": "now"}
    start, end = time_range.get("from", "now-6h"), time_range.get("to", "now")
    if end != "now" or not str(start).startswith("now-"):
        raise HarnessError("dashboard %s: time range %s..%s is not relative to now" % (model.get("uid"), start, end))
    return seconds(str(start)[4:])


def builtin_values(model: dict, rate_interval: str = DEFAULT_RATE_INTERVAL, interval: str = DEFAULT_INTERVAL) -> dict:
    span = int(range_seconds(model))
    return {
        "__rate_interval": rate_interval,
        "__interval": interval,
        "__interval_ms": str(int(seconds(interval) * 1000)),
        "__range": "%ds" % span,
        "__range_s": str(span),
        "__range_ms": str(span * 1000),
    }


def substitute(text: str, values: dict, regex_vars=frozenset()) -> str:
    """Replace $var, ${var}, ${var:fmt} and [[var]]; a variable without a value is an error."""

    def repl(match):
        name = match.group("braced") or match.group("old") or match.group("plain")
        fmt = match.group("fmt") or ""
        if name not in values:
            raise HarnessError("variable $%s has no value (known: %s)" % (name, ", ".join(sorted(values))))
        value = str(values[name])
        if fmt in ("", "regex", "pipe") and name in regex_vars and not name.startswith("__"):
            value = _REGEX_SPECIAL.sub(r"\\\1", value)
        return value

    return _VAR.sub(repl, text)


def _natural_key(text: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


# ----------------------------------------------------------------------------------------------- VictoriaMetrics
class VictoriaMetrics:
    """The few read endpoints of the Prometheus querying API the harness needs."""

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params) -> dict:
        data = urllib.parse.urlencode(params, doseq=True).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise HarnessError("HTTP %s from %s: %s" % (exc.code, path, detail)) from exc
        if body.get("status") != "success":
            raise HarnessError("%s answered %s" % (path, body))
        return body["data"]

    def query(self, expr: str, at: float):
        return self._get("/api/v1/query", {"query": expr, "time": "%.3f" % at})

    def query_range(self, expr: str, start: float, end: float, step: float):
        return self._get("/api/v1/query_range", {"query": expr, "start": "%.3f" % start, "end": "%.3f" % end,
                                                 "step": "%ds" % step})

    def label_values(self, label: str, match: str | None, start: float, end: float) -> list[str]:
        params = {"start": "%.3f" % start, "end": "%.3f" % end}
        if match:
            params["match[]"] = match
        return [str(v) for v in self._get("/api/v1/label/%s/values" % urllib.parse.quote(label), params)]


def resolve_variables(model: dict, vm: VictoriaMetrics, overrides=None, now: float | None = None) -> dict:
    """Concrete values for every template variable, in dashboard order (later ones may use earlier ones).

    A query variable takes the first value (Grafana's natural sort) that VictoriaMetrics lists over the dashboard's
    time range, unless `overrides` names one. A variable that lists nothing is an error: its panels would be empty.
    """
    overrides = dict(overrides or {})
    now = time.time() if now is None else now
    span = range_seconds(model)
    values = builtin_values(model)
    regex_vars = set()
    for var in (model.get("templating") or {}).get("list") or []:
        name, kind = var["name"], var.get("type", "query")
        if var.get("multi") or var.get("includeAll"):
            regex_vars.add(name)
        if name in overrides:
            values[name] = overrides.pop(name)
            continue
        if kind == "query":
            query = var.get("query")
            if isinstance(query, dict):
                query = query.get("query", "")
            parsed = _LABEL_VALUES.match(query or "")
            if not parsed:
                raise HarnessError("dashboard %s, variable %s: only label_values(...) queries are supported, got %r"
                                   % (model.get("uid"), name, query))
            match = parsed.group("match")
            if match:
                match = substitute(match, values, regex_vars)
            found = vm.label_values(parsed.group("label"), match, now - span, now)
            if var.get("regex"):
                found = [v for v in found if re.search(var["regex"], v)]
            found = sorted(set(found), key=_natural_key)
            if not found:
                raise HarnessError("dashboard %s, variable %s: %s lists no value in the last %ds"
                                   % (model.get("uid"), name, query, span))
            values[name] = found[0]
        elif kind in ("custom", "interval"):
            options = [o.strip() for o in str(var.get("query", "")).split(",") if o.strip()]
            if not options:
                raise HarnessError("dashboard %s, variable %s has no options" % (model.get("uid"), name))
            values[name] = options[0]
        elif kind in ("constant", "textbox"):
            values[name] = var.get("query", "")
        elif kind == "datasource":
            values[name] = (var.get("current") or {}).get("value", "")
        else:
            raise HarnessError("dashboard %s, variable %s: type %s is not supported" % (model.get("uid"), name, kind))
    if overrides:
        raise HarnessError("dashboard %s has no variable(s) %s" % (model.get("uid"), ", ".join(sorted(overrides))))
    values["__regex_vars__"] = regex_vars
    return values


def render(query: PanelQuery, values: dict) -> str:
    plain = {k: v for k, v in values.items() if k != "__regex_vars__"}
    return substitute(query.expr, plain, values.get("__regex_vars__", frozenset()))


def _count(data) -> tuple[int, int]:
    """(series, finite points) of a query result."""
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return 1, int(math.isfinite(float(result[1])))
    series = points = 0
    for item in result or []:
        samples = item.get("values") or ([item["value"]] if "value" in item else [])
        finite = sum(1 for _, v in samples if math.isfinite(float(v)))
        if finite:
            series += 1
            points += finite
    return series, points


def evaluate(query: PanelQuery, vm: VictoriaMetrics, values: dict, model: dict, now: float | None = None) -> Evaluation:
    """Run one panel query the way its panel does; never raises for a query problem (see Evaluation.error)."""
    now = time.time() if now is None else now
    try:
        rendered = render(query, values)
    except HarnessError as exc:
        return Evaluation(query, query.expr, error=str(exc))
    ev = Evaluation(query, rendered, values={k: v for k, v in values.items() if not k.startswith("__")})
    try:
        if query.instant:
            data = vm.query(rendered, now)
        else:
            span = range_seconds(model)
            step = max(MIN_STEP, int(span // MAX_POINTS))
            data = vm.query_range(rendered, now - span, now, step)
        ev.series, ev.points = _count(data)
    except (HarnessError, OSError, ValueError) as exc:
        ev.error = str(exc)
    return ev


def evaluate_all(vm_url: str, paths=None, overrides=None, now: float | None = None) -> list[Evaluation]:
    """Evaluate every panel query; `overrides` is {variable: value} for every dashboard that has the variable."""
    vm = VictoriaMetrics(vm_url)
    now = time.time() if now is None else now
    out = []
    for name, model in load_dashboards(paths).items():
        names = {v["name"] for v in (model.get("templating") or {}).get("list") or []}
        mine = {k: v for k, v in (overrides or {}).items() if k in names}
        try:
            values = resolve_variables(model, vm, mine, now)
        except HarnessError as exc:
            out.extend(Evaluation(q, q.expr, error=str(exc)) for q in panel_queries(model, name))
            continue
        out.extend(evaluate(q, vm, values, model, now) for q in panel_queries(model, name))
    return out


def check(vm_url: str, paths=None, overrides=None) -> list[str]:
    """Descriptions of every query that failed or returned nothing ([] when all returned data)."""
    return [ev.describe() for ev in evaluate_all(vm_url, paths, overrides) if not ev.ok]


# ----------------------------------------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vm", help="VictoriaMetrics base URL, e.g. http://127.0.0.1:8428")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="value of a template variable (every dashboard that has it); repeatable")
    parser.add_argument("--dashboard", action="append", default=[], metavar="FILE",
                        help="dashboard JSON file(s) instead of the role's")
    parser.add_argument("--list", action="store_true", help="only list the queries (no VictoriaMetrics needed)")
    args = parser.parse_args(argv)
    paths = args.dashboard or None
    if args.list:
        for q in all_queries(paths):
            print("%s\t%s\t%s" % (q.id, "instant" if q.instant else "range", q.expr))
        return 0
    if not args.vm:
        parser.error("--vm is required (or --list)")
    overrides = dict(item.split("=", 1) for item in args.var)
    results = evaluate_all(args.vm, paths, overrides)
    bad = [ev for ev in results if not ev.ok]
    for ev in results:
        print("%-4s %s" % ("ok" if ev.ok else "FAIL", ev.describe() if not ev.ok else "%s (%d series)"
                           % (ev.query.id, ev.series)))
    print("%d queries, %d returned data, %d failed or empty" % (len(results), len(results) - len(bad), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
