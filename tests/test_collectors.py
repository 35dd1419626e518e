"""playbooks/filter_plugins/hpcobs_collectors.py: node_exporter's collector flags from roles/node_exporter's lists,
and the systemd unit regex checked against the semantics node_exporter gives it (^(?:regex)$)."""
import importlib.util
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "hpcobs_collectors", os.path.join(ROOT, "playbooks", "filter_plugins", "hpcobs_collectors.py"))
collectors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(collectors)
with open(os.path.join(ROOT, "roles", "node_exporter", "defaults", "main.yml"), encoding="utf-8") as _handle:
    DEFAULTS = yaml.safe_load(_handle)


def matches(units, name):
    return re.match("^(?:%s)$" % collectors.systemd_unit_regex(units), name) is not None


def test_default_units_watch_the_stack_and_not_the_rest():
    units = DEFAULTS["node_exporter_systemd_units"]
    for name in ["node_exporter.service", "dcgm_exporter.service", "slurmd.service", "munge.service",
                 "nvidia-persistenced.service", "nvidia-fabricmanager.service", "hpcobs-slurm-metrics.service",
                 "promtail.service", "alloy.service"]:
        assert matches(units, name), name
    for name in ["ssh.service", "cron.service", "systemd-journald.service", "node_exporter.socket",
                 "xnode_exporter.service", "node_exporter.service.bak", "dbus.socket", "-.mount"]:
        assert not matches(units, name), name


def test_unit_regex_escapes_and_types():
    assert collectors.systemd_unit_regex(["a.b"]) == r"a\.b\.service"
    assert collectors.systemd_unit_regex(["x.timer", "x.timer", "y"]) == r"x\.timer|y\.service"
    assert matches(["lustre-*"], "lustre-client.service") and not matches(["lustre-*"], "lustre-client.mount")
    assert matches(["user@*"], "user@1000.service")
    assert matches(["*"], "anything.service") and not matches(["*"], "anything.socket")


@pytest.mark.parametrize("units", [[], "slurmd", ["a b"], ["a$"], ["(x|y)"], ["a\\x2d"], [None], ["a" * 300]])
def test_bad_units_are_refused(units):
    assert collectors.node_exporter_collector_problems(["systemd"], [], units)
    with pytest.raises(collectors.AnsibleFilterError):
        collectors.node_exporter_collector_args(["systemd"], [], units)


def test_default_flags():
    args = collectors.node_exporter_collector_args(
        DEFAULTS["node_exporter_collectors_enabled"], DEFAULTS["node_exporter_collectors_disabled"],
        DEFAULTS["node_exporter_systemd_units"] + DEFAULTS["node_exporter_systemd_units_extra"],
        DEFAULTS["node_exporter_exporter_metrics"])
    assert args[:5] == ["--collector.systemd", "--no-collector.cpufreq", "--no-collector.schedstat",
                        "--no-collector.softnet", "--no-collector.cpu.guest"]
    assert args[5].startswith(r"--collector.systemd.unit-include=node_exporter\.service|")
    assert args[6:] == ["--web.disable-exporter-metrics"]


def test_flags_follow_the_settings():
    assert collectors.node_exporter_collector_args([], [], ["x"], True) == []
    assert collectors.node_exporter_collector_args(["cpu.info", "cpu.info"], ["zfs"], ["x"], True) == [
        "--collector.cpu.info", "--no-collector.zfs"]


@pytest.mark.parametrize("enabled,disabled", [(["systemd"], ["systemd"]), (["Systemd"], []), ([], ["--x"]),
                                              ("systemd", []), ([], [1]), (["a..b"], [])])
def test_bad_collectors_are_refused(enabled, disabled):
    assert collectors.node_exporter_collector_problems(enabled, disabled, ["x"])
