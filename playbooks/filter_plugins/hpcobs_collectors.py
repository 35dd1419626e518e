"""node_exporter's collector flags, from the role's lists (roles/node_exporter; unit-tested in
tests/test_collectors.py).

- `hpcobs_node_exporter_collector_problems(enabled, disabled, systemd_units)`: what is wrong with the lists, one
  sentence each (empty: nothing). Collector names are node_exporter's (`systemd`, `cpufreq`) or a collector's
  boolean option (`cpu.guest`); a name in both lists is a contradiction. The systemd units are unit names
  (`slurmd.service`, or `slurmd`: `.service` is added) with `*` as the only wildcard (`nvidia-*`); `["*"]` is every
  service.
- `hpcobs_node_exporter_collector_args(enabled, disabled, systemd_units, exporter_metrics)`: the flags:
  `--collector.<name>` for each enabled one, `--no-collector.<name>` for each disabled one,
  `--collector.systemd.unit-include=<regex>` when the systemd collector is enabled (node_exporter anchors it:
  `^(?:<regex>)$`), and `--web.disable-exporter-metrics` unless exporter_metrics (node_exporter's own go_*,
  process_* and promhttp_* series). Raises on any problem.
- `hpcobs_systemd_unit_regex(units)`: that regex alone.
"""

from __future__ import annotations

import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # the unit tests run without Ansible too
    class AnsibleFilterError(Exception):
        pass

_COLLECTOR = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_-]*)*$")
# systemd unit names: ASCII letters, digits, ":", "-", "_", ".", "\" and "@" (systemd.unit(5)); "*" the wildcard here.
# The backslash (systemd's own escape in names) is left out: a site writes the unescaped name's glob instead.
_UNIT = re.compile(r"^[A-Za-z0-9:_.@*-]+$")
_UNIT_TYPES = ("service", "socket", "timer", "mount", "automount", "swap", "target", "path", "slice", "scope",
               "device")


def _unit_problems(units):
    if not isinstance(units, (list, tuple)):
        return ["node_exporter_systemd_units must be a list of unit names (got %r)" % (units,)]
    if not units:
        return ["node_exporter_systemd_units is empty: list the units to watch, or [\"*\"] for every service"]
    problems = []
    for unit in units:
        if not isinstance(unit, str) or not _UNIT.match(unit) or len(unit) > 256:
            problems.append("systemd unit %r is not a unit name (letters, digits, : _ . @ -, and * as wildcard)"
                            % (unit,))
    return problems


def _with_type(unit):
    suffix = unit.rsplit(".", 1)[-1] if "." in unit else ""
    return unit if suffix in _UNIT_TYPES else unit + ".service"


def systemd_unit_regex(units):
    """The --collector.systemd.unit-include value matching exactly these units (node_exporter adds ^(?: and )$)."""
    problems = _unit_problems(units)
    if problems:
        raise AnsibleFilterError("; ".join(problems))
    seen = []
    for unit in units:
        pattern = ".*".join(re.escape(part) for part in _with_type(unit).split("*"))
        if pattern not in seen:
            seen.append(pattern)
    return "|".join(seen)


def node_exporter_collector_problems(enabled, disabled, systemd_units):
    problems = []
    for name, value in (("node_exporter_collectors_enabled", enabled), ("node_exporter_collectors_disabled", disabled)):
        if not isinstance(value, (list, tuple)):
            problems.append("%s must be a list of collector names (got %r)" % (name, value))
            continue
        for item in value:
            if not isinstance(item, str) or not _COLLECTOR.match(item):
                problems.append("%s: %r is not a collector name like systemd, cpufreq or cpu.guest" % (name, item))
    if not problems:
        both = sorted(set(enabled) & set(disabled))
        if both:
            problems.append("collectors both enabled and disabled: %s" % ", ".join(both))
    problems += _unit_problems(systemd_units)
    return problems


def node_exporter_collector_args(enabled, disabled, systemd_units, exporter_metrics=False):
    problems = node_exporter_collector_problems(enabled, disabled, systemd_units)
    if problems:
        raise AnsibleFilterError("node_exporter collector settings: " + "; ".join(problems))
    args = ["--collector.%s" % name for name in dict.fromkeys(enabled)]
    args += ["--no-collector.%s" % name for name in dict.fromkeys(disabled)]
    if "systemd" in enabled:
        args.append("--collector.systemd.unit-include=" + systemd_unit_regex(systemd_units))
    if not exporter_metrics:
        args.append("--web.disable-exporter-metrics")
    return args


class FilterModule:
    def filters(self):
        return {
            "hpcobs_node_exporter_collector_problems": node_exporter_collector_problems,
            "hpcobs_node_exporter_collector_args": node_exporter_collector_args,
            "hpcobs_systemd_unit_regex": systemd_unit_regex,
        }
