"""The log path end to end: journal and Slurm log lines of the GPU node reach Loki on the management host with the
project's labels, positions survive a Promtail restart, stored logs survive a Loki restart.

Runs on the node (queries go through Loki's front as the stack's reader, from the management host: the node holds
no credential that reads) and drives the management host through its own connection.
"""
import time
import uuid

import testinfra
import yaml

from helpers import LOKI_LOCAL, MGMT, NODE, http, query, shipper
from polling import wait_for

testinfra_hosts = [NODE]

XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
# when this module logged the XID line (the verify step may run more than once on the same hosts)
STARTED = {}


def day_ago():
    return time.time_ns() - 86400 * 10 ** 9


def mgmt():
    return testinfra.get_host("podman://%s" % MGMT)


def lines(streams):
    return [value[1] for stream in streams for value in stream["values"]]


def test_kernel_xid_line_reaches_loki_labelled_as_kernel(host):
    since = STARTED["xid"] = time.time_ns() - 10 ** 9
    host.check_output("logger -t kernel -p kern.err %s" % repr(XID_LINE))
    streams = wait_for("the XID line in Loki", lambda: query(
        host, '{syslog_identifier="kernel", node="%s"} |= "NVRM: Xid"' % NODE, since), 30)
    assert lines(streams) == [XID_LINE]
    (stream,) = streams
    labels = stream["stream"]
    assert labels["node"] == NODE
    assert labels["syslog_identifier"] == "kernel"
    assert labels["job"] == "systemd-journal"
    assert labels["priority"] == "error"  # Promtail's keyword for PRIORITY=3
    # logger writes through the syslog socket; the kernel's own lines carry transport="kernel"
    assert labels["transport"] == "syslog"
    assert labels["host"] == NODE
    assert not [name for name in labels if name.startswith("__")]


def test_the_xid_line_is_selected_by_the_alert_selector(host):
    # the stream selector and line filter of the Loki XID alerts, as the ruler runs them
    streams = query(host, '{syslog_identifier="kernel"} |= "NVRM: Xid"', STARTED["xid"])
    assert XID_LINE in lines(streams)
    assert NODE in {s["stream"]["node"] for s in streams}


def test_slurm_log_file_reaches_loki(host):
    since = time.time_ns() - 3600 * 10 ** 9
    marker = "slurmd job 4242 launched %s" % uuid.uuid4().hex
    host.check_output("printf '%%s\\n' %s >> /var/log/slurm/slurmd.log" % repr(marker))
    streams = wait_for("the Slurm line in Loki", lambda: query(
        host, '{job="slurm", node="%s"} |= "%s"' % (NODE, marker), since), 30)
    (stream,) = streams
    labels = stream["stream"]
    # the labels that matter; Loki 3.x adds service_name (from job) and detected_level of its own
    assert (labels["job"], labels["node"], labels["filename"]) == ("slurm", NODE, "/var/log/slurm/slurmd.log")
    assert not set(labels) - {"job", "node", "filename", "service_name", "detected_level"}, labels
    assert not [name for name in labels if name.startswith("__")]
    # the line written before Promtail ever ran was read from the start of the file, once
    old = query(host, '{job="slurm", node="%s"} |= "written before promtail"' % NODE, day_ago())
    assert len(lines(old)) == 1


def test_positions_persist_across_a_restart(host):
    before = host.file("/var/lib/promtail/positions.yaml")
    assert before.user == "promtail" and before.mode & 0o007 == 0
    positions = yaml.safe_load(before.content_string)["positions"]
    # the keys the real Promtail writes: "cursor-<job_name>" for the journal, the path for a file
    assert positions["cursor-systemd-journal"] and "/var/log/slurm/slurmd.log" in positions
    marker = "hpcobs positions probe %s" % uuid.uuid4().hex
    since = time.time_ns() - 10 ** 9
    host.check_output("logger -t hpcobs-test %s" % marker)
    wait_for("the probe line in Loki", lambda: query(
        host, '{syslog_identifier="hpcobs-test"} |= "%s"' % marker, since), 30)
    host.check_output("systemctl restart promtail")
    wait_for("promtail ready after the restart",
             lambda: shipper(host, "promtail", "/ready", status=True)[0] == 200, 30)
    assert host.file("/var/lib/promtail/positions.yaml").exists
    second = "hpcobs positions probe after restart %s" % uuid.uuid4().hex
    host.check_output("logger -t hpcobs-test %s" % second)
    wait_for("a line logged after the restart", lambda: query(
        host, '{syslog_identifier="hpcobs-test"} |= "%s"' % second, since), 30)
    # the restarted Promtail went on from its saved cursor: nothing before it was sent a second time
    assert lines(query(host, '{syslog_identifier="hpcobs-test"} |= "%s"' % marker, since)) == [marker]
    assert lines(query(host, '{syslog_identifier="kernel"} |= "NVRM: Xid"', STARTED["xid"])).count(XID_LINE) == 1


def test_loki_keeps_logs_across_a_restart(host):
    store = mgmt()
    store.check_output("systemctl restart loki")
    wait_for("loki ready after the restart",
             lambda: http(store, LOKI_LOCAL + "/ready", status=True)[0] == 200, 60)
    assert XID_LINE in lines(query(host, '{syslog_identifier="kernel", node="%s"} |= "NVRM: Xid"' % NODE, day_ago()))
    assert store.file("/var/lib/loki/site-restore-marker").exists
