#!/usr/bin/env python3
"""Test helper of the management scenario: keeps test series alive in every VictoriaMetrics of the scenario.

Every --interval seconds, the Prometheus text of all *.prom files in --dir is concatenated and POSTed to
<url>/api/v1/import/prometheus of every --vm URL (samples without timestamps get VictoriaMetrics' current time),
the way a scrape would refresh them. The tests write, change and delete those files (atomically: a temporary file
with another suffix, then rename) to raise and clear faults. Errors (a VictoriaMetrics not up yet) are retried on
the next round. This is a test fixture for the scenario, not a stand-in for a product.

    series_pusher.py --dir /var/lib/hpcobs-e2e/series --vm http://mgmt1:8428 --vm http://mgmt2:8428
"""
import argparse
import glob
import os
import sys
import time
import urllib.request


def push(directory, urls):
    parts = []
    for path in sorted(glob.glob(os.path.join(directory, "*.prom"))):
        try:
            with open(path, "rb") as handle:
                parts.append(handle.read().rstrip(b"\n") + b"\n")
        except FileNotFoundError:
            continue
    if not parts:
        return
    data = b"".join(parts)
    for url in urls:
        request = urllib.request.Request(url.rstrip("/") + "/api/v1/import/prometheus", data=data, method="POST")
        try:
            urllib.request.urlopen(request, timeout=5).read()
        except OSError as err:
            print("push to %s failed: %s" % (url, err), file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--vm", action="append", required=True)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    while True:
        started = time.monotonic()
        push(args.dir, args.vm)
        time.sleep(max(0.5, args.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    main()
