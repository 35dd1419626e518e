#!/usr/bin/env python3
"""Cardinality per GPU node: the series each exporter of a deployed GPU node serves with the shipped defaults.

Deploys the GPU-node play (bench/deploy.py's node image, over SSH, security switch on) on one node with 8 simulated
GPUs, scrapes every exporter of the GPU nodes in the components map (files/components.yml) as the stack's scraper
does (HTTPS trusting the site CA, the component's client credential), and counts the series per exporter and per
metric family against the budget (1 500 series per 8-GPU node).

  bench/cardinality.py [--gpus 8] [--budget 1500] [--top 8] [--json FILE] [--keep]

The log shipper's own metrics are not counted (the test bundle's Promtail is a stand-in). A container has no BMC
and no disks of its own: ipmi_exporter and smartctl_exporter serve their own metrics only,
fewer series than on a real node (a node's sensors and disks add theirs). The certificate names the node, not its
address: the CA is checked, the host name is not.
"""
from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import re
import ssl
import sys
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


deploy = load("bench_deploy", REPO / "bench" / "deploy.py")
service = load("hpcobs_service", REPO / "playbooks" / "filter_plugins" / "hpcobs_service.py")

FAMILY = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


def families(text: str) -> Counter:
    """Series per metric name of a Prometheus text exposition (comments and blank lines are not series)."""
    counts: Counter = Counter()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = FAMILY.match(line)
        if match:
            counts[match.group(1)] += 1
    return counts


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--budget", type=int, default=1500)
    parser.add_argument("--top", type=int, default=8, help="metric families listed per exporter")
    parser.add_argument("--json", type=Path, help="write the counts here too")
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bench" / "cardinality")
    parser.add_argument("--keep", action="store_true", help="leave the node running")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    key = deploy.ensure_key(args.out)
    deploy.build_image()
    components = service.load_components()
    # the exporters of a GPU node; the log shippers' own metrics are left out (the test bundle's Promtail and Alloy
    # are stand-ins, whose metrics are not the real programs')
    names = [name for name, entry in components.items()
             if "port" in entry and "gpu_nodes" in entry["groups"] and name not in ("promtail", "alloy")]
    try:
        nodes = deploy.start_nodes(1, key.with_suffix(".pub"))
        inventory = args.out / "inventory.json"
        deploy.write_inventory(inventory, nodes, key, "ssh", args.out / "pki",
                               extra_vars={"lab_gpu_simulator_gpus": args.gpus})
        figures = deploy.run_play(deploy.PLAYS["full"], inventory, args.out / "deploy.log", "ssh")
        if figures["rc"] != 0:
            sys.exit("bench-cardinality: the deploy failed (rc %d): %s" % (figures["rc"], args.out / "deploy.log"))
        address = next(iter(nodes.values()))
        counts = {name: families(scrape(address, name, args.out / "pki", components)) for name in names}
    finally:
        if not args.keep:
            deploy.remove_nodes()
    total = sum(sum(c.values()) for c in counts.values())
    print("Series per %d-GPU node, shipped defaults (budget %d):" % (args.gpus, args.budget))
    print("| exporter | series | per GPU | largest metric families |")
    print("|---|---|---|---|")
    for name in names:
        top = ", ".join("%s %d" % item for item in counts[name].most_common(args.top))
        print("| %s | %d | %.1f | %s |" % (name, sum(counts[name].values()), sum(counts[name].values()) / args.gpus,
                                           top))
    print("| **total** | **%d** | %.1f | %s |" % (total, total / args.gpus,
                                                  "within the budget" if total <= args.budget else "OVER the budget"))
    if args.json:
        args.json.write_text(json.dumps({"gpus": args.gpus, "budget": args.budget, "total": total,
                                         "exporters": {n: dict(c) for n, c in counts.items()}}, indent=1))
    return 0 if total <= args.budget else 1


if __name__ == "__main__":
    sys.exit(main())
