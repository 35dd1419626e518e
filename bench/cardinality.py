#!/usr/bin/env python3
"""Cardinality per GPU node: the series each exporter of a deployed GPU node serves with the shipped defaults, the
series VictoriaMetrics stores of them after the shipped scrape-time drops, and both projected to a real GPU node.

Deploys the GPU-node play (bench/deploy.py's node image, over SSH, security switch on) on one node with 8 simulated
GPUs, scrapes every exporter of the GPU nodes in the components map (files/components.yml) as the stack's scraper
does (HTTPS trusting the site CA, the component's client credential), and counts the series per exporter and per
metric family against the budget (1 500 series per 8-GPU node). Then the real victoria-metrics binary scrapes the
node once with the role's scrape jobs (roles/victoriametrics victoriametrics_scrape_jobs: their
metric_relabel_configs, the site CA, the credentials) and the series it stored are counted per job.

  bench/cardinality.py [--gpus 8] [--budget 1500] [--top 8] [--json FILE] [--keep]
  bench/cardinality.py --from DIR    (recount the expositions an earlier run saved in DIR, no deploy, no store)

Projection: a container has 2 CPUs, no BMC, no disk of its own and few units; the series that grow with the
hardware are counted per CPU (`cpu` label), per systemd unit (`name` of node_systemd_*), per disk (`device` of
node_disk_*, smartctl_*), per network interface (`device` of node_network_*, loopback apart) and per BMC sensor (`id`
of ipmi_*), and multiplied by a reference GPU node's counts (REFERENCE). Where the container has none of an item
(BMC sensors, smartctl's disks) the per-item figure is an assumption (ASSUMED), said so in the output. The
reference node's units are REFERENCE_UNITS, filtered by the systemd collector's unit-include as deployed.

The log shipper's own metrics are not counted (the test bundle's Promtail is a stand-in).
"""
from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import re
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


deploy = load("bench_deploy", REPO / "bench" / "deploy.py")
service = load("hpcobs_service", REPO / "playbooks" / "filter_plugins" / "hpcobs_service.py")
collectors = load("hpcobs_collectors", REPO / "playbooks" / "filter_plugins" / "hpcobs_collectors.py")

FAMILY = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# The exporters' jobs (roles/victoriametrics victoriametrics_scrape_jobs) and the series VictoriaMetrics adds to
# every target it scrapes (stored too).
SCRAPE_META = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
               "scrape_series_added", "scrape_timeout_seconds", "scrape_response_size_bytes",
               "scrape_samples_limit", "scrape_labels_limit")

# A reference 8-GPU node: 2 x 64 cores (128 CPUs, no SMT counted), 250 systemd units, 150 BMC sensors, 4 NVMe disks
# (and node_exporter's diskstats of them), 10 network interfaces (8 InfiniBand ports, 2 Ethernet) besides loopback.
REFERENCE = {"cpu": 128, "unit": 250, "sensor": 150, "disk": 4, "interface": 10}
# Its units: those of the stack and the GPU node's services the role lists, the rest of a distribution's 250.
REFERENCE_UNITS = (["node_exporter.service", "dcgm_exporter.service", "ipmi_exporter.service",
                    "smartctl_exporter.service", "promtail.service", "slurmd.service", "munge.service",
                    "nvidia-persistenced.service", "nvidia-fabricmanager.service", "nvidia-dcgm.service",
                    "nvidia-imex.service"]
                   + ["other%03d.service" % i for i in range(239)])
# Per item, where the container has none to count: ipmi_exporter's FreeIPMI collector serves a reading and a state
# per sensor; smartctl_exporter 30-60 per disk (NVMe at the low end; 45 taken).
ASSUMED = {("ipmi_exporter", "sensor"): 2, ("smartctl_exporter", "disk"): 45}


def parse(text: str) -> list[tuple[str, dict]]:
    """(metric name, labels) of each series of a Prometheus text exposition (comments and blank lines are not)."""
    series = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = FAMILY.match(line)
        if match:
            rest = line[match.end():]
            labels = dict(LABEL.findall(rest[:rest.rindex("}")])) if rest.startswith("{") else {}
            series.append((match.group(1), labels))
    return series


def families(text: str) -> Counter:
    """Series per metric name of a Prometheus text exposition."""
    return Counter(name for name, _ in parse(text))


def scaling_item(exporter: str, name: str, labels: dict):
    """(dimension, item) of a series that grows with the hardware, None for one that does not."""
    if name in SCRAPE_META:
        return None
    if exporter == "node_exporter":
        if "cpu" in labels:
            return "cpu", labels["cpu"]
        if name.startswith("node_systemd_") and "name" in labels:
            return "unit", labels["name"]
        if name.startswith("node_disk_") and "device" in labels:
            return "disk", labels["device"]
        if name.startswith("node_network_") and labels.get("device", "lo") != "lo":
            return "interface", labels["device"]
    if exporter == "ipmi_exporter" and "id" in labels:
        return "sensor", labels["id"]
    if exporter == "smartctl_exporter" and "device" in labels:
        return "disk", labels["device"]
    return None


def breakdown(exporter: str, series) -> dict:
    """{fixed: n, dims: {dimension: [items seen, series]}} of one exporter's series."""
    fixed, dims = 0, {}
    for name, labels in series:
        item = scaling_item(exporter, name, labels)
        if item is None:
            fixed += 1
            continue
        seen = dims.setdefault(item[0], [set(), 0])
        seen[0].add(item[1])
        seen[1] += 1
    return {"fixed": fixed, "dims": {dim: [len(items), n] for dim, (items, n) in dims.items()}}


DIMENSIONS = {"node_exporter": ("cpu", "unit", "disk", "interface"), "ipmi_exporter": ("sensor",),
              "smartctl_exporter": ("disk",)}


def project(exporter: str, parts: dict, reference: dict) -> tuple[float, list[str]]:
    """Series of the exporter on the reference node, and how each dimension was counted."""
    total, notes = float(parts["fixed"]), []
    for dim in DIMENSIONS.get(exporter, ()):
        items, count = parts["dims"].get(dim, [0, 0])
        if items:
            per = count / items
            how = "%.1f per %s measured" % (per, dim)
        elif (exporter, dim) in ASSUMED:
            per = ASSUMED[(exporter, dim)]
            how = "%d per %s ASSUMED (none in the container)" % (per, dim)
        else:
            per, how = 0, "none measured"
        total += per * reference[dim]
        notes.append("%s x %d %s" % (how, reference[dim], dim))
    return total, notes


def reference_units(unit_include: str | None) -> int:
    """The reference node's units the systemd collector watches (every one without a unit-include)."""
    if not unit_include:
        return len(REFERENCE_UNITS)
    pattern = re.compile("^(?:%s)$" % unit_include)
    return sum(1 for unit in REFERENCE_UNITS if pattern.match(unit))


def node_exporter_unit_include() -> str:
    """The unit-include the role's defaults give (roles/node_exporter: the list and the site's extra, none here)."""
    defaults = yaml.safe_load((REPO / "roles" / "node_exporter" / "defaults" / "main.yml").read_text())
    if "systemd" not in defaults["node_exporter_collectors_enabled"]:
        return ""
    return collectors.systemd_unit_regex(defaults["node_exporter_systemd_units"]
                                         + defaults["node_exporter_systemd_units_extra"])


def _evaluated(value, variables: dict):
    """A job's config with its Jinja expressions ("{{ ... }}", e.g. the dcgm job's relabelling) evaluated with the
    project's filters and the role's defaults, as Ansible does when it renders scrape.yml."""
    if isinstance(value, dict):
        return {key: _evaluated(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [_evaluated(item, variables) for item in value]
    found = re.fullmatch(r"\s*\{\{(.*)\}\}\s*", value, re.S) if isinstance(value, str) else None
    if not found:
        return value
    import jinja2

    env = jinja2.Environment()
    env.filters.update(service.FilterModule().filters())
    return env.compile_expression(found.group(1).strip())(**variables)


def scrape_jobs() -> dict:
    """The role's scrape jobs, by component (roles/victoriametrics defaults, expressions evaluated)."""
    defaults = yaml.safe_load((REPO / "roles" / "victoriametrics" / "defaults" / "main.yml").read_text())
    return {job.get("component"): dict(job, name=name, config=_evaluated(job.get("config") or {}, defaults))
            for name, job in defaults["victoriametrics_scrape_jobs"].items() if "component" in job}


def store_config(address: str, names, components: dict, pki_dir: Path) -> dict:
    """A VictoriaMetrics scrape configuration of the node: the role's job per exporter, its metric_relabel_configs,
    HTTPS with the site CA and the component's credential, as the role's scrape.yml.j2 writes them."""
    jobs = scrape_jobs()
    configs = []
    for name in names:
        entry, job = components[name], jobs[name]
        scrape = {"job_name": job["name"], "scrape_interval": "5s", "scrape_timeout": "5s",
                  "metrics_path": entry.get("metrics_path", "/metrics"),
                  "static_configs": [{"targets": ["%s:%d" % (address, entry["port"])]}]}
        scrape.update((job.get("config") or {}))
        if entry.get("tls"):
            scrape["scheme"] = "https"
            scrape["tls_config"] = {"ca_file": str(pki_dir / "ca.crt")}
            if service.component_auth(name, components) == "basic":
                scrape["basic_auth"] = {"username": service.shared_fact("client_user"),
                                        "password_file": str(pki_dir / "credentials"
                                                             / service.client_credential(name, components))}
        configs.append(scrape)
    return {"scrape_configs": configs}


def victoria_metrics() -> str:
    tools = os.environ.get("HPCOBS_TOOLS_BIN") or str(REPO / ".cache" / "tools" / "bin")
    found = shutil.which("victoria-metrics", path=tools + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        sys.exit("bench-cardinality: no victoria-metrics binary (make tools, or HPCOBS_TOOLS_BIN)")
    return found


def vm_get(port: int, path: str, **params) -> dict:
    url = "http://127.0.0.1:%d%s?%s" % (port, path, urllib.parse.urlencode(params, doseq=True))
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def stored_series(config: dict, jobs, work: Path, port: int = 18428, timeout: float = 120) -> dict:
    """{job: [(name, labels)]}: what the real victoria-metrics stores after scraping the node with `config`."""
    (work / "scrape.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    log = (work / "victoria-metrics.log").open("w")
    process = subprocess.Popen([victoria_metrics(), "-storageDataPath=%s" % (work / "data"),
                                "-httpListenAddr=127.0.0.1:%d" % port, "-promscrape.config=%s" % (work / "scrape.yml"),
                                "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        last, stable = None, 0
        while True:
            time.sleep(2)
            try:
                vm_get(port, "/internal/force_flush")
            except (OSError, ValueError):
                pass
            try:
                found = {job: vm_get(port, "/api/v1/series", **{"match[]": '{job="%s"}' % job,
                                                                  "start": str(int(time.time()) - 600)})["data"]
                         for job in jobs}
            except OSError:
                found = None
            sizes = found and {job: len(items) for job, items in found.items()}
            if sizes and all(sizes.values()) and sizes == last:
                stable += 1
                if stable >= 2:
                    break
            else:
                stable = 0
            last = sizes
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("victoria-metrics did not store the node's series (see %s)"
                                   % (work / "victoria-metrics.log"))
        up = vm_get(port, "/api/v1/query", query="up")["data"]["result"]
        down = [item["metric"]["job"] for item in up if item["value"][1] != "1"]
        if down:
            raise RuntimeError("victoria-metrics could not scrape %s" % ", ".join(down))
    finally:
        process.terminate()
        process.wait(30)
        log.close()
    return {job: [(labels.pop("__name__"), labels) for labels in items] for job, items in found.items()}


def scrape(address: str, component: str, pki_dir: Path, components: dict) -> str:
    entry = components[component]
    secured = bool(entry.get("tls"))
    url = "%s://%s:%d%s" % ("https" if secured else "http", address, entry["port"], entry.get("metrics_path", "/metrics"))
    request = urllib.request.Request(url)
    context = None
    if secured:
        context = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
        context.check_hostname = False  # the certificate names the node; the CA is still checked
        if service.component_auth(component, components) == "basic":
            secret = (pki_dir / "credentials" / service.client_credential(component, components)).read_text().strip()
            token = base64.b64encode(("%s:%s" % (service.shared_fact("client_user"), secret)).encode()).decode()
            request.add_header("Authorization", "Basic " + token)
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return response.read().decode()


def exporter_names(components: dict) -> list[str]:
    # the exporters of a GPU node; the log shippers' own metrics are left out (the test bundle's Promtail and Alloy
    # are stand-ins, whose metrics are not the real programs')
    return [name for name, entry in components.items()
            if "port" in entry and "gpu_nodes" in entry["groups"] and name not in ("promtail", "alloy")]


def figures(served: dict, stored: dict | None, unit_include: str | None, reference: dict | None = None) -> dict:
    """Per exporter: series served and stored (measured), both projected to the reference node."""
    reference = dict(reference or REFERENCE)
    reference["unit"] = reference_units(unit_include)
    out = {}
    for name, series in served.items():
        row = {"served": len(series), "families": Counter(n for n, _ in series)}
        row["served_projected"], row["served_how"] = project(name, breakdown(name, series), reference)
        if stored is not None:
            kept = stored[name]
            row["stored"] = len(kept)
            row["stored_meta"] = sum(1 for n, _ in kept if n in SCRAPE_META)
            row["stored_projected"], row["stored_how"] = project(name, breakdown(name, kept), reference)
        out[name] = row
    return {"reference": reference, "exporters": out}


def report(result: dict, gpus: int, budget: int, top: int) -> bool:
    rows = result["exporters"]
    measured = any("stored" in row for row in rows.values())
    print("Series per %d-GPU node (budget %d). Measured: one container node (2 CPUs, no BMC, no disk of its own)."
          % (gpus, budget))
    print("| exporter | served | stored by VictoriaMetrics | largest families served |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print("| %s | %d | %s | %s |" % (name, row["served"],
                                         "%d (%d of them scrape metadata)" % (row["stored"], row["stored_meta"])
                                         if measured else "not measured",
                                         ", ".join("%s %d" % item for item in row["families"].most_common(top))))
    served = sum(row["served"] for row in rows.values())
    stored = sum(row.get("stored", 0) for row in rows.values())
    print("| **total** | **%d** | **%s** | |" % (served, stored if measured else "not measured"))
    ref = result["reference"]
    print()
    print("PROJECTION to a reference 8-GPU node (%d CPUs, %d watched systemd units, %d BMC sensors, %d disks, "
          "%d network interfaces), from the per-item counts above:" % (ref["cpu"], ref["unit"], ref["sensor"],
                                                                       ref["disk"], ref["interface"]))
    print("| exporter | served (projected) | stored (projected) | how |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print("| %s | %.0f | %s | %s |" % (name, row["served_projected"],
                                           "%.0f" % row["stored_projected"] if measured else "not measured",
                                           "; ".join(row["stored_how"] if measured else row["served_how"]) or "fixed"))
    served_p = sum(row["served_projected"] for row in rows.values())
    stored_p = sum(row.get("stored_projected", 0) for row in rows.values())
    print("| **total (projected)** | **%.0f** | **%s** | budget %d: %s |" % (
        served_p, "%.0f" % stored_p if measured else "not measured", budget,
        "within" if (stored_p if measured else served_p) <= budget else "OVER"))
    return (stored if measured else served) <= budget and (stored_p if measured else served_p) <= budget


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--budget", type=int, default=1500)
    parser.add_argument("--top", type=int, default=8, help="metric families listed per exporter")
    parser.add_argument("--json", type=Path, help="write the counts here too")
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bench" / "cardinality")
    parser.add_argument("--from", dest="source", type=Path,
                        help="recount the expositions saved by an earlier run in this directory (no deploy)")
    parser.add_argument("--unit-include", default=None,
                        help="with --from: the systemd unit-include the saved run had ('' for every unit)")
    parser.add_argument("--keep", action="store_true", help="leave the node running")
    args = parser.parse_args()
    components = service.load_components()
    names = exporter_names(components)
    if args.source:
        texts = {name: (args.source / ("%s.prom" % name)).read_text() for name in names}
        saved = args.source / "stored.json"
        stored = ({n: [tuple(item) for item in v] for n, v in json.loads(saved.read_text()).items()}
                  if saved.exists() else None)
        unit_include = node_exporter_unit_include() if args.unit_include is None else args.unit_include
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        key = deploy.ensure_key(args.out)
        deploy.build_image()
        try:
            nodes = deploy.start_nodes(1, key.with_suffix(".pub"))
            inventory = args.out / "inventory.json"
            deploy.write_inventory(inventory, nodes, key, "ssh", args.out / "pki",
                                   extra_vars={"lab_gpu_simulator_gpus": args.gpus})
            run = deploy.run_play(deploy.PLAYS["full"], inventory, args.out / "deploy.log", "ssh")
            if run["rc"] != 0:
                sys.exit("bench-cardinality: the deploy failed (rc %d): %s" % (run["rc"], args.out / "deploy.log"))
            address = next(iter(nodes.values()))
            texts = {name: scrape(address, name, args.out / "pki", components) for name in names}
            jobs = scrape_jobs()
            with tempfile.TemporaryDirectory(prefix="hpcobs-bench-vm-") as work:
                by_job = stored_series(store_config(address, names, components, args.out / "pki"),
                                       [jobs[name]["name"] for name in names], Path(work))
            stored = {name: by_job[jobs[name]["name"]] for name in names}
        finally:
            if not args.keep:
                deploy.remove_nodes()
        for name, text in texts.items():
            (args.out / ("%s.prom" % name)).write_text(text)
        (args.out / "stored.json").write_text(json.dumps(stored))
        unit_include = node_exporter_unit_include()
    served = {name: parse(text) for name, text in texts.items()}
    result = figures(served, stored, unit_include)
    ok = report(result, args.gpus, args.budget, args.top)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gpus": args.gpus, "budget": args.budget, "reference": result["reference"],
                                         "exporters": {n: {k: (dict(v) if isinstance(v, Counter) else v)
                                                           for k, v in row.items()}
                                                       for n, row in result["exporters"].items()}}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
