#!/usr/bin/env python3
"""Test helper of the management scenario: keeps test series alive in every VictoriaMetrics of the scenario.

Every --interval seconds, the Prometheus text of all *.prom files in --dir is concatenated and POSTed to
<url>/api/v1/import/prometheus of every --vm URL (samples without timestamps get VictoriaMetrics' current time),
the way a scrape would refresh them. The tests write, change and delete those files (atomically: a temporary file
with another suffix, then rename) to raise and clear faults. Errors (a VictoriaMetrics not up yet) are retried on
the next round. With --ca, --user and --password-file (read every round: the files may appear after the helper
starts), it trusts that CA and sends HTTP basic auth, as a client of a secured VictoriaMetrics must. This is a test
fixture for the scenario, not a stand-in for a product.

    series_pusher.py --dir /var/lib/hpcobs-e2e/series --vm https://mgmt1:8428 --vm https://mgmt2:8428 \
        --ca /var/lib/hpcobs-e2e/ca.crt --user hpcobs --password-file /var/lib/hpcobs-e2e/vm-client-password
"""
import argparse
import base64
import glob
import os
import ssl
import sys
import time
import urllib.request


def client(ca, user, password_file):
    """(SSL context, headers) of a request: the CA's trust and basic auth when given and their files exist."""
    context = ssl.create_default_context(cafile=ca) if ca and os.path.exists(ca) else None
    headers = {}
    if user and password_file and os.path.exists(password_file):
        with open(password_file, encoding="utf-8") as handle:
            token = base64.b64encode(("%s:%s" % (user, handle.read().strip())).encode()).decode()
        headers["Authorization"] = "Basic " + token
    return context, headers


def push(directory, urls, ca=None, user=None, password_file=None):
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
    context, headers = client(ca, user, password_file)
    for url in urls:
        request = urllib.request.Request(url.rstrip("/") + "/api/v1/import/prometheus", data=data, method="POST",
                                         headers=headers)
        try:
            urllib.request.urlopen(request, timeout=5, context=context).read()
        except OSError as err:
            print("push to %s failed: %s" % (url, err), file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--vm", action="append", required=True)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--ca", help="CA file to trust (https)")
    parser.add_argument("--user", help="basic auth user")
    parser.add_argument("--password-file", help="file holding the basic auth password")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    while True:
        started = time.monotonic()
        push(args.dir, args.vm, args.ca, args.user, args.password_file)
        time.sleep(max(0.5, args.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    main()
