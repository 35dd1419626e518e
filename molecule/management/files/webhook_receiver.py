#!/usr/bin/env python3
"""Test helper of the management scenario: an HTTP endpoint that records every notification POSTed to it.

Alertmanager's webhook receivers of the scenario point here, one URL path per receiver (/oncall, /ops,
/physics-team, ...). Each POST is appended as one JSON line to the record file:
    {"received": <unix time>, "path": "/oncall", "query": "token=...", "body": <the JSON Alertmanager sent>}
GET /notifications returns the record file. This is a test fixture for the scenario, not a stand-in for a product.

    webhook_receiver.py --listen 0.0.0.0:8080 --record /var/lib/hpcobs-e2e/notifications.jsonl
"""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

LOCK = threading.Lock()


def make_handler(record):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server naming)
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw.decode("utf-8"))
            except ValueError:
                body = {"unparsed": raw.decode("utf-8", "replace")}
            url = urlsplit(self.path)
            entry = {"received": time.time(), "path": url.path, "query": url.query, "body": body}
            with LOCK, open(record, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry, sort_keys=True) + "\n")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):  # noqa: N802
            if urlsplit(self.path).path != "/notifications":
                self.send_error(404)
                return
            with LOCK:
                data = open(record, "rb").read() if os.path.exists(record) else b""
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="0.0.0.0:8080")
    parser.add_argument("--record", required=True)
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    os.makedirs(os.path.dirname(args.record), exist_ok=True)
    ThreadingHTTPServer((host, int(port)), make_handler(args.record)).serve_forever()


if __name__ == "__main__":
    main()
