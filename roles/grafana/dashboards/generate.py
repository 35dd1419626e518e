#!/usr/bin/env python3
"""The hpcobs Grafana dashboards, as code (Grafana's foundation SDK for Python).

Development-time generator: it writes roles/grafana/files/dashboards/hpcobs-*.json, which are committed and which the
grafana role provisions. Nothing here runs on a deployment host or needs the SDK there.

    python3 roles/grafana/dashboards/generate.py            # rewrite the JSON files
    python3 roles/grafana/dashboards/generate.py --check    # exit 1 if a committed file differs

tests/test_dashboards.py regenerates the dashboards and fails when the committed JSON is not what this file produces,
so edit this file, run it, and commit both. SDK release: grafana-foundation-sdk==1769699241 (the "next" build, which
follows Grafana 12; the releases tagged 10.x/11.x target older dashboard schemas).

Every query reads the VictoriaMetrics datasource the role provisions (uid VM_UID) and uses the recording rules of the
vmalert role (docs/alerts.md) and the metric contract of docs/development.md: dcgm-exporter series carry `node`,
`gpu`, `modelName`, `UUID` and, while a Slurm job holds the GPU, `hpc_job` on the fields of the shared fact
gpu_job_fields only (files/components.yml; one copy per job: per-GPU panels take `max by (node, gpu)` so a shared GPU
is drawn once); `hpcobs_slurm_job_info{hpc_job,user,account,partition}` names the
job's owner. The Slurm board reads the names of Slurm's metrics/openmetrics plugin (slurmctld 25.11+ or the
slurm_metrics collector, one copy per controller: panels take `max without (instance)`) and the collector's
hpcobs_slurm_node_state_info.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, gauge, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

OUT_DIR = Path(__file__).resolve().parents[1] / "files" / "dashboards"

# The datasource the grafana role provisions for VictoriaMetrics (type prometheus). Fixed, never site-configurable:
# the committed dashboards name it.
VM_UID = "hpcobs-vm"
VM = common.DataSourceRef(type_val="prometheus", uid=VM_UID)

EXECUTIVE_UID = "hpcobs-executive"
FLEET_UID = "hpcobs-gpu-fleet"
JOB_UID = "hpcobs-job-account"
SLURM_UID = "hpcobs-slurm"
TAGS = ["hpcobs"]

# Series selectors shared by the GPU fleet / node dashboard.
SEL = 'node=~"$node", gpu=~"$gpu"'
PER_GPU_LEGEND = "{{node}} GPU {{gpu}}"


# ----------------------------------------------------------------------------------------------------- helpers
def q(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table_format: bool = False):
    """A PromQL target on the VictoriaMetrics datasource."""
    target = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(VM)
    if legend:
        target = target.legend_format(legend)
    target = target.instant() if instant else target.range()
    if table_format:
        target = target.format(pm.PromQueryFormat.TABLE)
    return target


def refs(*targets):
    """Give targets consecutive refIds A, B, C... (each built with q(..., ref=<placeholder>))."""
    return [t.ref_id(chr(ord("A") + i)) for i, t in enumerate(targets)]


def steps(*pairs):
    """Threshold steps: (None, 'green'), (1, 'red')..."""
    return dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in pairs])


def fixed_color(name: str):
    return dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": name})


def link(title: str, url: str):
    return dm.DynamicConfigValue(id_val="links", value=[{"title": title, "url": url}])


def stat_panel(title: str, description: str, targets, unit: str = "none", thresholds=None, decimals=None):
    panel = (stat.Panel().title(title).description(description).datasource(VM).targets(refs(*targets))
             .unit(unit).height(5).span(4)
             .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .color_mode(common.BigValueColorMode.VALUE).graph_mode(common.BigValueGraphMode.NONE)
             .text_mode(common.BigValueTextMode.AUTO)
             .thresholds(thresholds or steps((None, "blue"))))
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def ts_panel(title: str, description: str, targets, unit: str, span: int = 12, height: int = 8,
             stacked: bool = False, legend_table: bool = False):
    legend = common_builders.VizLegendOptions().show_legend(True).placement(
        common.LegendPlacement.RIGHT if legend_table else common.LegendPlacement.BOTTOM).display_mode(
        common.LegendDisplayMode.TABLE if legend_table else common.LegendDisplayMode.LIST)
    if legend_table:
        legend = legend.calcs(["lastNotNull", "max"])
    panel = (timeseries.Panel().title(title).description(description).datasource(VM).targets(refs(*targets))
             .unit(unit).height(height).span(span).legend(legend)
             .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                      .sort(common.SortOrder.DESCENDING))
             .line_width(1).fill_opacity(25 if stacked else 8).show_points(common.VisibilityMode.NEVER))
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    return panel


def dashed(regexp: str):
    """Override that draws the matching series (limits, maxima) as dashed lines without fill."""
    return (regexp, [dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
                     dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0)])


def table_panel(title: str, description: str, targets, columns: dict[str, str], sort_by: str, span: int = 24,
                height: int = 8, hide=("Time",)):
    """An instant table: one row per label set, one column per target (merged on the labels).

    Columns are renamed (organize) before overrides apply: overrides and sortBy name the new column titles."""
    organize = {"excludeByName": {name: True for name in hide}, "renameByName": columns,
                "indexByName": {}}
    return (table.Panel().title(title).description(description).datasource(VM).targets(refs(*targets))
            .height(height).span(span)
            .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options=organize))
            .sort_by([common_builders.TableSortByFieldState().display_name(sort_by).desc(True)]))


def dashboard_links(current_uid: str):
    return [dashboard.DashboardLink("hpcobs dashboards").type(dm.DashboardLinkType.DASHBOARDS).tags(TAGS)
            .as_dropdown(True).include_vars(False).keep_time(True)]


def query_var(name: str, label: str, query: str, include_all: bool, all_value: str = "", multi: bool = False):
    var = (dashboard.QueryVariable(name).label(label).datasource(VM).query(query)
           .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC)
           .multi(multi).include_all(include_all).allow_custom_value(True))
    if all_value:
        var = var.all_value(all_value)
    return var


def base(uid: str, title: str, description: str, time_from: str):
    return (dashboard.Dashboard(title).uid(uid).description(description).tags(TAGS).refresh("1m")
            .time(time_from, "now").timezone("browser").readonly()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .links(dashboard_links(uid)))


# ------------------------------------------------------------------------------------------- executive board
def executive():
    """At most six panels: is the GPU fleet healthy, who is using it, what does it cost in energy."""
    job_link = "/d/%s/?var-account=${__data.fields.account}&var-job=${__data.fields.hpc_job}&${__url_time_range}" % JOB_UID
    account_link = "/d/%s/?var-account=${__data.fields.account}&${__url_time_range}" % JOB_UID

    health = (stat_panel(
        "GPU fleet health",
        "Healthy: GPUs reporting without a firing hardware alert (fleet:hpcobs_gpus_healthy:count). Total: GPUs the "
        "fleet had in the last 24 h (fleet:hpcobs_gpus:count). Unhealthy: alerting, missing, or on a node whose "
        "dcgm-exporter is silent (fleet:hpcobs_gpus_unhealthy:count). Details: the GPU fleet / node dashboard.",
        [q("fleet:hpcobs_gpus_healthy:count", "Healthy", instant=True),
         q("fleet:hpcobs_gpus:count", "Total", instant=True),
         q("fleet:hpcobs_gpus_unhealthy:count", "Unhealthy", instant=True)],
        thresholds=steps((None, "green"), (1, "red")), decimals=0)
        .span(8).height(6)
        .override_by_name("Healthy", [fixed_color("green")])
        .override_by_name("Total", [fixed_color("text")])
        .with_override(dm.MatcherConfig(id_val="byName", options="Unhealthy"),
                       [dm.DynamicConfigValue(id_val="links", value=[{
                           "title": "GPU fleet / node dashboard", "url": "/d/%s/?${__url_time_range}" % FLEET_UID}])]))

    alerts = (stat_panel(
        "Firing alerts",
        "Alerts vmalert is firing now, by severity (every copy counts: a GPU alert in a job shared by two jobs "
        "counts twice). Critical ones page the on-call engineer.",
        [q('count(ALERTS{alertstate="firing", severity="critical"}) or vector(0)', "Critical", instant=True),
         q('count(ALERTS{alertstate="firing", severity="warning"}) or vector(0)', "Warning", instant=True),
         q('count(ALERTS{alertstate="firing", severity="info"}) or vector(0)', "Info", instant=True)],
        thresholds=steps((None, "green"), (1, "orange")), decimals=0)
        .span(8).height(6)
        .override_by_name("Critical", [dm.DynamicConfigValue(id_val="thresholds", value={
            "mode": "absolute", "steps": [{"value": None, "color": "green"}, {"value": 1, "color": "red"}]})])
        .override_by_name("Info", [dm.DynamicConfigValue(id_val="thresholds", value={
            "mode": "absolute", "steps": [{"value": None, "color": "green"}, {"value": 1, "color": "blue"}]})]))

    use = (gauge.Panel().title("GPU use now").description(
        "Allocated: share of the fleet's GPUs held by a Slurm job (fleet:hpcobs_gpus_in_use:count / "
        "fleet:hpcobs_gpus:count). Busy: mean utilisation of the GPUs that report it (MIG instances do not; "
        "fleet:hpcobs_gpu_utilization_percent:avg). "
        "Allocated far above busy means jobs hold GPUs they do not use.")
        .datasource(VM).span(8).height(6).unit("percent").min(0).max(100).decimals(0)
        .targets(refs(q("100 * fleet:hpcobs_gpus_in_use:count / fleet:hpcobs_gpus:count", "Allocated to jobs",
                        instant=True),
                      q("fleet:hpcobs_gpu_utilization_percent:avg", "Busy (mean utilisation)",
                        instant=True)))
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(steps((None, "blue"))))

    power = (ts_panel(
        "GPU power by account",
        "GPU power drawn for each account's jobs (account:hpcobs_gpu_power_watts:sum), stacked, and the rest of the "
        "fleet's GPU power (idle GPUs, jobs whose owner is not known yet).",
        [q("sum by (account) (account:hpcobs_gpu_power_watts:sum)", "{{account}}"),
         q("sum(fleet:hpcobs_gpu_power_watts:sum) - (sum(account:hpcobs_gpu_power_watts:sum) or vector(0))",
           "not in a job")],
        unit="watt", stacked=True, height=9)
        .override_by_name("not in a job", [fixed_color("#808080")]))

    accounts = (table_panel(
        "Accounts: GPUs, power and energy",
        "Per Slurm account: GPUs its jobs hold now, their GPU power now, and GPU energy over the last hour and the "
        "last 24 hours (rolling). Click an account for its drill-down.",
        [q("sum by (account) (account:hpcobs_gpus_in_use:count)", instant=True, table_format=True),
         q("sum by (account) (account:hpcobs_gpu_power_watts:sum)", instant=True, table_format=True),
         q("sum by (account) (account:hpcobs_gpu_energy_kwh:increase1h)", instant=True, table_format=True),
         q("sum by (account) (account:hpcobs_gpu_energy_kwh:increase24h)", instant=True, table_format=True)],
        columns={"account": "Account", "Value #A": "GPUs in use", "Value #B": "Power (W)",
                 "Value #C": "Energy last 1 h (kWh)", "Value #D": "Energy last 24 h (kWh)"},
        sort_by="Energy last 24 h (kWh)", span=12, height=9)
        .decimals(1)
        .override_by_name("Account", [link("Account drill-down", account_link)]))

    jobs = (table_panel(
        "Top jobs by GPU-hours, last 24 h",
        "The ten jobs that used the most GPU-hours in the last 24 hours (finished jobs included), with their GPU "
        "energy. Click a job for its drill-down.",
        [q("topk(10, sum by (hpc_job, user, account) (hpc_job:hpcobs_gpu_hours:increase24h))",
           instant=True, table_format=True),
         q("sum by (hpc_job, user, account) (hpc_job:hpcobs_gpu_energy_kwh:increase24h)"
           " and on (hpc_job) topk(10, sum by (hpc_job, user, account) (hpc_job:hpcobs_gpu_hours:increase24h))",
           instant=True, table_format=True)],
        columns={"hpc_job": "Job", "user": "User", "account": "Account", "Value #A": "GPU-hours",
                 "Value #B": "Energy (kWh)"},
        sort_by="GPU-hours", height=8)
        .decimals(1)
        .override_by_name("Job", [link("Job drill-down", job_link)]))

    return (base(EXECUTIVE_UID, "HPC GPU fleet: executive overview",
                 "Is the GPU fleet healthy, who is using it, what does it cost in energy. Six panels; details are "
                 "in the GPU fleet / node and job / account dashboards.", "now-24h")
            .with_panel(health).with_panel(alerts).with_panel(use)
            .with_panel(power).with_panel(accounts).with_panel(jobs))


# ----------------------------------------------------------------------------------------- GPU fleet / node
def per_gpu(metric: str) -> str:
    return "max by (node, gpu) (%s{%s})" % (metric, SEL)


def per_gpu_rate(metric: str, divisor: str = "") -> str:
    expr = "max by (node, gpu) (rate(%s{%s}[$__rate_interval]))" % (metric, SEL)
    return "%s / %s" % (expr, divisor) if divisor else expr


def fleet():
    gpu_table_by = "max by (node, gpu, modelName) (%s{%s})"
    # A field stored without the job: its last sample within a minute, so a GPU's row keeps the value through the
    # stale marker a job change on the GPU leaves for one scrape (docs/alerts.md, vmalert_gpu_field_lookback).
    gpu_table_last = "max by (node, gpu, modelName) (last_over_time(%s{%s}[1m]))"
    overview = [
        stat_panel("GPUs reporting", "GPUs dcgm-exporter reports on the selected nodes (node:hpcobs_gpus:count).",
                   [q('sum(node:hpcobs_gpus:count{node=~"$node"})', instant=True)], decimals=0),
        stat_panel("GPUs in jobs", "GPUs of the selected nodes held by at least one Slurm job.",
                   [q('count(group by (node, gpu) (DCGM_FI_DEV_GPU_TEMP{node=~"$node", hpc_job!=""})) or vector(0)',
                      instant=True)], decimals=0),
        stat_panel("Firing GPU alerts", "GPU alerts firing now on the selected nodes (one per GPU and job).",
                   [q('count(ALERTS{alertstate="firing", alertname=~"HpcobsGpu.+", node=~"$node"}) or vector(0)',
                      instant=True)], thresholds=steps((None, "green"), (1, "red")), decimals=0),
        stat_panel("Unhealthy GPUs (whole fleet)",
                   "GPUs alerting, missing, or on a node whose dcgm-exporter is silent "
                   "(fleet:hpcobs_gpus_unhealthy:count).",
                   [q("fleet:hpcobs_gpus_unhealthy:count", instant=True)],
                   thresholds=steps((None, "green"), (1, "red")), decimals=0),
        stat_panel("Hottest GPU", "Highest GPU die temperature among the selected GPUs.",
                   [q("max(DCGM_FI_DEV_GPU_TEMP{%s})" % SEL, instant=True)], unit="celsius",
                   thresholds=steps((None, "green"), (75, "orange"), (83, "red")), decimals=0),
        stat_panel("GPU power", "Board power of the selected GPUs, summed.",
                   [q("sum(%s)" % per_gpu("DCGM_FI_DEV_POWER_USAGE"), instant=True)], unit="watt", decimals=0),
    ]
    gpus = (table_panel(
        "GPUs",
        "One row per GPU: temperature, power, utilisation, last XID, uncorrectable ECC errors since the last reset "
        "and how many Slurm jobs hold it now.",
        [q(gpu_table_by % ("DCGM_FI_DEV_GPU_TEMP", SEL), instant=True, table_format=True),
         q(gpu_table_by % ("DCGM_FI_DEV_POWER_USAGE", SEL), instant=True, table_format=True),
         q(gpu_table_by % ("DCGM_FI_DEV_GPU_UTIL", SEL), instant=True, table_format=True),
         q(gpu_table_last % ("DCGM_FI_DEV_XID_ERRORS", SEL), instant=True, table_format=True),
         q(gpu_table_last % ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", SEL), instant=True, table_format=True),
         q('count by (node, gpu, modelName) (group by (node, gpu, modelName, hpc_job) '
           '(DCGM_FI_DEV_GPU_TEMP{%s, hpc_job!=""}))'
           ' or 0 * group by (node, gpu, modelName) (DCGM_FI_DEV_GPU_TEMP{%s})' % (SEL, SEL),
           instant=True, table_format=True)],
        columns={"node": "Node", "gpu": "GPU", "modelName": "Model", "Value #A": "Temperature (°C)",
                 "Value #B": "Power (W)", "Value #C": "Utilisation (%)", "Value #D": "Last XID",
                 "Value #E": "ECC uncorrectable", "Value #F": "Jobs"},
        sort_by="Temperature (°C)", height=9)
        .decimals(0)
        .override_by_name("Last XID", [dm.DynamicConfigValue(id_val="mappings", value=[
            {"type": "value", "options": {"0": {"text": "none", "color": "green"}}}])]))

    thermal = [
        ts_panel("GPU temperature", "GPU die temperature. The critical threshold is the model's max operating "
                 "temperature (vmalert_gpu_temp_critical_celsius_by_model).",
                 [q(per_gpu("DCGM_FI_DEV_GPU_TEMP"), PER_GPU_LEGEND)], unit="celsius", span=6),
        ts_panel("Memory (HBM) temperature", "HBM temperature; at 95 °C and above the memory throttles silently.",
                 [q(per_gpu("DCGM_FI_DEV_MEMORY_TEMP"), PER_GPU_LEGEND)], unit="celsius", span=6),
        ts_panel("Thermal throttling", "Share of time the clocks were held down for temperature "
                 "(rate of DCGM_FI_DEV_THERMAL_VIOLATION, nanoseconds per second).",
                 [q(per_gpu_rate("DCGM_FI_DEV_THERMAL_VIOLATION", "1e9"), PER_GPU_LEGEND)],
                 unit="percentunit", span=6),
        ts_panel("Power-cap throttling", "Share of time the clocks were held down by the power cap "
                 "(rate of DCGM_FI_DEV_POWER_VIOLATION).",
                 [q(per_gpu_rate("DCGM_FI_DEV_POWER_VIOLATION", "1e9"), PER_GPU_LEGEND)],
                 unit="percentunit", span=6),
    ]
    errors = [
        ts_panel("Uncorrectable ECC errors", "Double-bit ECC errors since the last GPU reset. Any value above 0 "
                 "pages on-call (HpcobsGpuEccUncorrectable): drain, reset, run dcgmi diag.",
                 [q(per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), PER_GPU_LEGEND)], unit="none", span=6),
        ts_panel("Corrected ECC errors", "Single-bit ECC errors corrected per second.",
                 [q(per_gpu_rate("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), PER_GPU_LEGEND)], unit="cps", span=6),
        ts_panel("Last XID error", "Code of the most recent XID error of each GPU (0: none); it stays until the "
                 "driver reloads. 48, 63, 64, 74, 79, 94 and 95 page on-call.",
                 [q(per_gpu("DCGM_FI_DEV_XID_ERRORS"), PER_GPU_LEGEND)], unit="none", span=6)
        .mappings([dm.ValueMap(options={"0": dm.ValueMappingResult(text="none")})]),
        (ts_panel("HBM row remapping", "Rows remapped after uncorrectable errors, remaps waiting for a GPU reset, "
                  "and remap failures (RMA).",
                  [q(per_gpu("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), "remapped {{node}} GPU {{gpu}}"),
                   q(per_gpu("DCGM_FI_DEV_ROW_REMAP_PENDING"), "pending {{node}} GPU {{gpu}}"),
                   q(per_gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "failure {{node}} GPU {{gpu}}")],
                  unit="none", span=6)),
    ]
    power = [
        (ts_panel("GPU power and enforced limit", "Board power per GPU; dashed: the power limit the board enforces.",
                  [q(per_gpu("DCGM_FI_DEV_POWER_USAGE"), PER_GPU_LEGEND),
                   q(per_gpu("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"), "limit {{node}} GPU {{gpu}}")],
                  unit="watt", span=12)
         .override_by_regexp(*dashed("^limit "))),
        ts_panel("GPU power per node", "GPU board power summed per node.",
                 [q('sum by (node) (max by (node, gpu) (DCGM_FI_DEV_POWER_USAGE{node=~"$node"}))', "{{node}}")],
                 unit="watt", span=12),
    ]
    links = [
        (ts_panel("PCIe link width", "Current PCIe link width per GPU; dashed: the widest link the GPU supports. "
                  "A narrower link (HpcobsGpuPcieLinkWidthDegraded) points at a riser, cable or slot.",
                  [q(per_gpu("DCGM_FI_DEV_PCIE_LINK_WIDTH"), PER_GPU_LEGEND),
                   q(per_gpu("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"), "max {{node}} GPU {{gpu}}")], unit="none", span=6)
         .override_by_regexp(*dashed("^max "))),
        (ts_panel("PCIe link generation", "Current PCIe generation per GPU (drops when idle); dashed: the maximum.",
                  [q(per_gpu("DCGM_FI_DEV_PCIE_LINK_GEN"), PER_GPU_LEGEND),
                   q(per_gpu("DCGM_FI_DEV_PCIE_MAX_LINK_GEN"), "max {{node}} GPU {{gpu}}")], unit="none", span=6)
         .override_by_regexp(*dashed("^max "))),
        ts_panel("PCIe replays", "PCIe replays per second (link errors the link layer recovered).",
                 [q(per_gpu_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), PER_GPU_LEGEND)], unit="cps", span=6),
        ts_panel("NVLink errors", "NVLink CRC, replay and recovery errors per second, all links of the GPU.",
                 [q("max by (node, gpu) (rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{%s}[$__rate_interval]))"
                    % SEL, "CRC flit {{node}} GPU {{gpu}}"),
                  q("max by (node, gpu) (rate(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{%s}[$__rate_interval]))"
                    % SEL, "CRC data {{node}} GPU {{gpu}}"),
                  q("max by (node, gpu) (rate(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{%s}[$__rate_interval]))"
                    % SEL, "replay {{node}} GPU {{gpu}}"),
                  q("max by (node, gpu) (rate(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{%s}[$__rate_interval]))"
                    % SEL, "recovery {{node}} GPU {{gpu}}")], unit="cps", span=6),
    ]
    usage = [
        ts_panel("GPU utilisation", "Share of time a kernel was running (not reported for MIG instances).",
                 [q(per_gpu("DCGM_FI_DEV_GPU_UTIL"), PER_GPU_LEGEND)], unit="percent", span=8),
        ts_panel("Frame buffer used", "Share of the GPU memory in use.",
                 # per GPU (MIG: per instance) before the division: FB_USED carries the job, FB_FREE does not
                 [q("max by (node, gpu) (%s / (%s + %s))"
                    % tuple("max by (node, gpu, GPU_I_ID) (%s{%s})" % (metric, SEL) for metric in
                            ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")),
                    PER_GPU_LEGEND)], unit="percentunit", span=8),
        ts_panel("Tensor core activity", "Fraction of cycles the tensor pipes were busy (profiling metric).",
                 [q(per_gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), PER_GPU_LEGEND)], unit="percentunit", span=8),
    ]

    board = (base(FLEET_UID, "HPC GPU fleet: GPUs and nodes",
                  "Health of every GPU: temperature, throttling, ECC, XID, power, PCIe and NVLink, per node and GPU.",
                  "now-6h")
             .with_variable(query_var("node", "Node", "label_values(DCGM_FI_DEV_GPU_TEMP, node)",
                                      include_all=True, all_value=".+", multi=True))
             .with_variable(query_var("gpu", "GPU", 'label_values(DCGM_FI_DEV_GPU_TEMP{node=~"$node"}, gpu)',
                                      include_all=True, all_value=".+", multi=True)))
    board = board.with_row(dashboard.Row("Overview"))
    for panel in overview:
        board = board.with_panel(panel)
    board = board.with_panel(gpus)
    for title, panels in (("Temperature and throttling", thermal), ("Errors: ECC, XID, row remapping", errors),
                          ("Power", power)):
        board = board.with_row(dashboard.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    for title, panels in (("PCIe and NVLink", links), ("Utilisation", usage)):
        row = dashboard.Row(title).collapsed(True)
        for panel in panels:
            row = row.with_panel(panel)
        board = board.with_row(row)
    return board


# ---------------------------------------------------------------------------------- job / account drill-down
def job_account():
    acc = 'account=~"$account"'
    job = 'hpc_job=~"$job"'
    job_link = "/d/%s/?var-account=${account}&var-job=${__data.fields.hpc_job}&${__url_time_range}" % JOB_UID

    account_stats = [
        stat_panel("GPUs in use now", "GPUs (MIG instances count one each) held by the account's jobs now.",
                   [q("sum(account:hpcobs_gpus_in_use:count{%s}) or vector(0)" % acc, instant=True)], decimals=0),
        stat_panel("GPU power now", "GPU power drawn for the account's jobs now.",
                   [q("sum(account:hpcobs_gpu_power_watts:sum{%s}) or vector(0)" % acc, instant=True)],
                   unit="watt", decimals=0),
        stat_panel("GPU energy, last 24 h", "GPU energy of the account's jobs over the last 24 hours (rolling); "
                   "the energy budget alert compares this value with the account's budget.",
                   [q("sum(account:hpcobs_gpu_energy_kwh:increase24h{%s})" % acc, instant=True)],
                   unit="kwatth", decimals=1),
        stat_panel("GPU energy, time range", "GPU energy of the account's jobs over the dashboard's time range "
                   "(e.g. \"Today so far\").",
                   [q("sum(integrate(account:hpcobs_gpu_power_watts:sum{%s}[$__range])) / 3.6e6" % acc,
                      instant=True)], unit="kwatth", decimals=1),
        stat_panel("Jobs, last 24 h", "Jobs of the account that held GPUs in the last 24 hours.",
                   [q("count(hpc_job:hpcobs_gpu_hours:increase24h{%s}) or vector(0)" % acc, instant=True)],
                   decimals=0),
        stat_panel("Firing alerts on its jobs", "Alerts firing now that name one of the account's jobs "
                   "(GPU faults, hung GPUs, energy budget).",
                   [q('count(ALERTS{alertstate="firing", %s}) or vector(0)' % acc, instant=True)],
                   thresholds=steps((None, "green"), (1, "red")), decimals=0),
    ]
    account_series = [
        ts_panel("GPU power by account", "GPU power of the selected account's jobs (all accounts: one line each).",
                 [q("sum by (account) (account:hpcobs_gpu_power_watts:sum{%s})" % acc, "{{account}}")],
                 unit="watt", span=12),
        ts_panel("GPUs in use by account", "GPUs held by the selected account's jobs.",
                 [q("sum by (account) (account:hpcobs_gpus_in_use:count{%s})" % acc, "{{account}}")],
                 unit="none", span=12),
    ]
    jobs_table = (table_panel(
        "Jobs of the last 24 h",
        "The account's jobs that held GPUs in the last 24 hours: GPU-hours and GPU energy (finished jobs included), "
        "GPUs and power now (running jobs). Click a job id to drill down.",
        [q("sum by (hpc_job, user, account) (hpc_job:hpcobs_gpu_hours:increase24h{%s})" % acc,
           instant=True, table_format=True),
         q("sum by (hpc_job, user, account) (hpc_job:hpcobs_gpu_energy_kwh:increase24h{%s})" % acc,
           instant=True, table_format=True),
         q("sum by (hpc_job, user, account) (hpc_job:hpcobs_gpus_in_use:count{%s})" % acc,
           instant=True, table_format=True),
         q("sum by (hpc_job, user, account) (hpc_job:hpcobs_gpu_power_watts:sum{%s})" % acc,
           instant=True, table_format=True)],
        columns={"hpc_job": "Job", "user": "User", "account": "Account", "Value #A": "GPU-hours",
                 "Value #B": "Energy (kWh)", "Value #C": "GPUs now", "Value #D": "Power now (W)"},
        sort_by="GPU-hours", height=8)
        .decimals(1)
        .override_by_name("Job", [link("Job drill-down", job_link)]))

    job_stats = [
        stat_panel("GPUs held", "GPUs the job holds now, all its nodes together.",
                   [q("sum(hpc_job:hpcobs_gpus_in_use:count{%s}) or vector(0)" % job, instant=True)], decimals=0),
        stat_panel("GPU power now", "GPU power of the job now (a GPU shared by several jobs is split equally).",
                   [q("sum(hpc_job:hpcobs_gpu_power_watts:sum{%s}) or vector(0)" % job, instant=True)],
                   unit="watt", decimals=0),
        stat_panel("GPU-hours, last 24 h", "GPU-hours the job used in the last 24 hours.",
                   [q("sum(hpc_job:hpcobs_gpu_hours:increase24h{%s})" % job, instant=True)], decimals=1),
        stat_panel("GPU energy, last 24 h", "GPU energy of the job in the last 24 hours.",
                   [q("sum(hpc_job:hpcobs_gpu_energy_kwh:increase24h{%s})" % job, instant=True)],
                   unit="kwatth", decimals=2),
        stat_panel("Firing alerts on its GPUs", "Alerts firing now that name the job (GPU faults on its GPUs, "
                   "hung GPU).",
                   [q('count(ALERTS{alertstate="firing", %s}) or vector(0)' % job, instant=True)],
                   thresholds=steps((None, "green"), (1, "red")), decimals=0),
        stat_panel("Mean utilisation of its GPUs", "Mean utilisation of the job's GPUs now; near 0 while the "
                   "memory is full is the hang pattern (HpcobsGpuHungJob).",
                   [q("avg(DCGM_FI_DEV_GPU_UTIL{%s})" % job, instant=True)], unit="percent",
                   thresholds=steps((None, "red"), (5, "orange"), (30, "green")), decimals=0),
    ]
    job_gpus = (table_panel(
        "Its GPUs",
        "Where the job runs: one row per GPU (or MIG instance) holding it, with the owner from Slurm.",
        [q("max by (hpc_job, node, gpu, GPU_I_ID, modelName, UUID) (DCGM_FI_DEV_GPU_UTIL{%s}"
           " or DCGM_FI_PROF_GR_ENGINE_ACTIVE{%s} * 100)" % (job, job), instant=True, table_format=True),
         q("max by (hpc_job, node, gpu, GPU_I_ID, modelName, UUID) (DCGM_FI_DEV_POWER_USAGE{%s})" % job,
           instant=True, table_format=True),
         q("max by (hpc_job, node, gpu, GPU_I_ID, modelName, UUID) (DCGM_FI_DEV_FB_USED{%s})" % job,
           instant=True, table_format=True),
         q("max by (hpc_job, node, gpu, GPU_I_ID, modelName, UUID) (DCGM_FI_DEV_GPU_TEMP{%s})" % job,
           instant=True, table_format=True)],
        columns={"hpc_job": "Job", "node": "Node", "gpu": "GPU", "GPU_I_ID": "MIG instance", "modelName": "Model",
                 "Value #A": "Utilisation (%)", "Value #B": "Board power (W)", "Value #C": "Memory used (MiB)",
                 "Value #D": "Temperature (°C)"},
        sort_by="Node", span=16, height=7)
        .decimals(0))
    # The per-job report is hpcobs-jobstats, a command on the login nodes and controllers (it reads this
    # VictoriaMetrics; there is no web service to link to): the table gives the command line for the job, built by
    # the query itself (MetricsQL label_set/label_join) so it always names the job shown.
    jobstats_cmd = ('label_del(label_join(label_set(%s, "jobstats_cmd", "hpcobs-jobstats"), "jobstats", " ", '
                    '"jobstats_cmd", "hpc_job"), "jobstats_cmd")')
    owner = (table_panel(
        "Owner",
        "The job as Slurm reported it (hpcobs_slurm_job_info, written by the prolog on each node of the job). Its "
        "per-job report (utilisation, memory and power per GPU, energy, GPU-hours, alerts, verdict): run the "
        "command in the last column on a login node or controller (add --json for JSON; roles/slurm_metrics "
        "README, hpcobs-jobstats).",
        [q(jobstats_cmd % ("count by (hpc_job, user, account, partition) "
                           "(last_over_time(hpcobs_slurm_job_info{%s}[$__range]))" % job),
           instant=True, table_format=True)],
        columns={"hpc_job": "Job", "user": "User", "account": "Account", "partition": "Partition",
                 "Value #A": "Nodes", "jobstats": "Per-job report (run on a login node)"},
        sort_by="Job", span=8, height=7))
    job_series = [
        ts_panel("Utilisation of its GPUs", "Utilisation of each GPU the job holds.",
                 [q("max by (node, gpu) (DCGM_FI_DEV_GPU_UTIL{%s})" % job, PER_GPU_LEGEND)], unit="percent", span=8),
        ts_panel("Power of its GPUs", "Board power of each GPU the job holds (whole GPU, shared or not), and the "
                 "job's attributed power.",
                 [q("max by (node, gpu) (DCGM_FI_DEV_POWER_USAGE{%s})" % job, PER_GPU_LEGEND),
                  q("sum(hpc_job:hpcobs_gpu_power_watts:sum{%s})" % job, "job total (attributed)")],
                 unit="watt", span=8),
        ts_panel("Memory used on its GPUs", "Frame buffer in use on each GPU the job holds.",
                 [q("max by (node, gpu) (DCGM_FI_DEV_FB_USED{%s})" % job, PER_GPU_LEGEND)], unit="decmbytes",
                 span=8),
    ]

    board = (base(JOB_UID, "HPC GPU fleet: job and account drill-down",
                  "Pick an account (or all) and a job id: GPUs, power, energy and alerts of the account and of the "
                  "job. Job ids of the last 24 hours are listed; any id can be typed in.", "now-24h")
             .with_variable(query_var("account", "Account",
                                      "label_values(account:hpcobs_gpu_energy_kwh:increase24h, account)",
                                      include_all=True, all_value=".*"))
             .with_variable(query_var("job", "Job id",
                                      'label_values(hpc_job:hpcobs_gpu_hours:increase24h{account=~"$account"}, hpc_job)',
                                      include_all=False)))
    board = board.with_row(dashboard.Row("Account: $account"))
    for panel in account_stats + account_series + [jobs_table]:
        board = board.with_panel(panel)
    board = board.with_row(dashboard.Row("Job: $job"))
    for panel in job_stats + [job_gpus, owner] + job_series:
        board = board.with_panel(panel)
    return board


# ----------------------------------------------------------------------------------------------- Slurm board
def slurm():
    """The scheduler: queue, nodes by state (with the reasons), GPUs allocated vs in use per partition and account."""
    one = "max without (instance, node, job)"
    unavailable = 'state=~"down|drained|draining|fail|failing"'
    stats = [
        stat_panel("Jobs running", "Jobs in state RUNNING now.",
                   [q("%s (slurm_jobs_running)" % one, instant=True)], decimals=0),
        stat_panel("Jobs pending", "Jobs waiting in the queue now (all partitions).",
                   [q("%s (slurm_jobs_pending)" % one, instant=True)], decimals=0),
        stat_panel("Nodes unavailable", "Nodes down, drained, draining or failing (HpcobsSlurmNodeUnavailable); the "
                   "table below names them with the reason.",
                   [q("count(max without (instance) (hpcobs_slurm_node_state_info{%s})) or vector(0)" % unavailable,
                      instant=True)], thresholds=steps((None, "green"), (1, "orange")), decimals=0),
        stat_panel("GPUs allocated", "Share of the cluster's GPUs allocated to jobs now.",
                   [q("sum(max without (instance) (slurm_node_gpus_alloc)) / sum(max without (instance) "
                      "(slurm_node_gpus))", instant=True)], unit="percentunit", decimals=0),
        stat_panel("GPUs allocated but idle", "GPUs allocated to a job whose utilisation is at or below 1 % now "
                   "(dcgm-exporter), over all GPUs allocated.",
                   [q('count(max by (node, gpu) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""}) <= 1) / '
                      "sum(max without (instance) (slurm_node_gpus_alloc)) or vector(0)", instant=True)],
                   unit="percentunit", thresholds=steps((None, "green"), (0.25, "orange"), (0.5, "red")),
                   decimals=0),
        stat_panel("Scheduler cycle", "Last main scheduling cycle of slurmctld (sdiag); "
                   "HpcobsSlurmSchedulerSlow warns above 3 s.",
                   [q("%s (slurm_schedule_cycle_last) / 1e6" % one, instant=True)], unit="s",
                   thresholds=steps((None, "green"), (1, "orange"), (3, "red")), decimals=3),
    ]
    series = [
        ts_panel("Queue", "Running and pending jobs.",
                 [q("%s (slurm_jobs_running)" % one, "running"), q("%s (slurm_jobs_pending)" % one, "pending")],
                 unit="none", span=12),
        ts_panel("Nodes by state", "Nodes per state as sinfo spells it (idle, mixed, allocated, drained, down, ...).",
                 [q("count by (state) (max without (instance) (hpcobs_slurm_node_state_info))", "{{state}}")],
                 unit="none", span=12, stacked=True),
        ts_panel("GPUs per partition: allocated and total", "GPUs allocated to jobs (solid) and all GPUs of the "
                 "partition (dashed; GPUs of drained and down nodes included).",
                 [q("%s (slurm_partition_jobs_gpus_alloc)" % one, "{{partition}} allocated"),
                  q("%s (slurm_partition_gpus)" % one, "{{partition}} total")],
                 unit="none", span=12)
        .override_by_regexp(*dashed(".* total")),
        ts_panel("GPUs per account: allocated and in use", "GPUs Slurm allocated to each account's jobs (solid) "
                 "and GPUs those jobs hold in dcgm-exporter's view (dashed, account:hpcobs_gpus_in_use:count). "
                 "A gap is GPUs allocated to no running process of the job only when their utilisation is low: "
                 "see the idle share above.",
                 [q("%s (slurm_account_jobs_gpus_alloc)" % one, "{{account}} allocated"),
                  q("sum by (account) (account:hpcobs_gpus_in_use:count)", "{{account}} in use")],
                 unit="none", span=12)
        .override_by_regexp(*dashed(".* in use")),
        ts_panel("Scheduling cycles", "slurmctld's last main and backfill scheduling cycle (sdiag, seconds).",
                 [q("%s (slurm_schedule_cycle_last) / 1e6" % one, "main"),
                  q("%s (slurm_bf_cycle_last) / 1e6" % one, "backfill")],
                 unit="s", span=12),
        ts_panel("Pending jobs per account", "Jobs of each account waiting in the queue.",
                 [q("%s (slurm_account_jobs_pending)" % one, "{{account}}")], unit="none", span=12,
                 stacked=True),
    ]
    nodes = (table_panel(
        "Nodes",
        "Every Slurm node: state and reason as Slurm has them, GPUs allocated and total.",
        [q("max without (instance, job) (hpcobs_slurm_node_state_info)", instant=True, table_format=True),
         q("max without (instance, job) (slurm_node_gpus_alloc)", instant=True, table_format=True),
         q("max without (instance, job) (slurm_node_gpus)", instant=True, table_format=True)],
        columns={"node": "Node", "state": "State", "reason": "Reason", "Value #B": "GPUs allocated",
                 "Value #C": "GPUs"},
        sort_by="GPUs allocated", height=8, hide=("Time", "Value #A"))
        .decimals(0))
    board = base(SLURM_UID, "HPC GPU fleet: Slurm", "The scheduler: queue, nodes by state with their reasons, GPUs "
                 "allocated against GPUs in use per partition and account, scheduling cycles.", "now-24h")
    for panel in stats + series + [nodes]:
        board = board.with_panel(panel)
    return board


DASHBOARDS = {
    "hpcobs-executive.json": executive,
    "hpcobs-gpu-fleet.json": fleet,
    "hpcobs-job-account.json": job_account,
    "hpcobs-slurm.json": slurm,
}


# ------------------------------------------------------------------------------------------------- rendering
def _number_panels(panels, counter):
    for panel in panels:
        counter[0] += 1
        panel["id"] = counter[0]
        _number_panels(panel.get("panels", []), counter)


def render(name: str) -> str:
    """The JSON text of one dashboard, exactly as committed."""
    model = json.loads(json.dumps(DASHBOARDS[name]().build(), cls=JSONEncoder))
    _number_panels(model["panels"], [0])
    model["version"] = 1
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed files")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory (%(default)s)")
    args = parser.parse_args(argv)
    stale = []
    for name in sorted(DASHBOARDS):
        text = render(name)
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print("%s %s" % ("differs:" if args.check else "wrote", path))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
