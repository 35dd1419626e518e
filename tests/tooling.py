"""Where the unit tests find the real binaries they run (vmalert, victoria-metrics, amtool, ...), and a real
victoria-metrics loaded with series for the tests that query one."""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> Path:
    """An executable: from $HPCOBS_TOOLS_BIN when set (and only there), else .cache/tools/bin, else PATH; the test
    fails when there is none."""
    env_dir = os.environ.get("HPCOBS_TOOLS_BIN")
    if env_dir:
        path = Path(env_dir) / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
        pytest.fail("%s not found in HPCOBS_TOOLS_BIN=%s (expected an executable %s)" % (name, env_dir, path))
    cached = REPO / ".cache" / "tools" / "bin" / name
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    found = shutil.which(name)
    if found:
        return Path(found)
    pytest.fail("%s not found in %s or on PATH: run make tools" % (name, cached.parent))


SERVICE_ROLE = REPO / "roles" / "service"
# The project's filters (ansible.cfg filter_plugins): a test that sets ANSIBLE_FILTER_PLUGINS itself keeps them on it.
PROJECT_FILTERS = REPO / "playbooks" / "filter_plugins"


def service_unit_vars(role_dir: Path) -> dict:
    """What a role's unit is rendered from: roles/service's defaults with the vars its configure.yml gives the
    shared unit template (its one import_role of service, tasks_from unit). Render SERVICE_ROLE's
    templates/service.service.j2 with them, and ANSIBLE_FILTER_PLUGINS=PROJECT_FILTERS."""
    import yaml

    tasks = yaml.safe_load((role_dir / "tasks" / "configure.yml").read_text())
    calls = [task for task in tasks if (task.get("ansible.builtin.import_role") or {}).get("tasks_from") == "unit"]
    assert len(calls) == 1, "%s/tasks/configure.yml should write its unit through roles/service" % role_dir.name
    values = yaml.safe_load((SERVICE_ROLE / "defaults" / "main.yml").read_text()) or {}
    values.update(calls[0]["vars"])
    return values


def import_lines(series):
    """Prometheus import lines of {(metric, ((label, value), ...)): [(unix seconds, value), ...]}."""
    lines = []
    for (metric, labels), points in series.items():
        label_text = ",".join('%s="%s"' % (k, v) for k, v in labels)
        for ts, value in points:
            lines.append("%s{%s} %s %d" % (metric, label_text, repr(float(value)), ts * 1000))
    return lines


@contextlib.contextmanager
def victoriametrics(data_dir, lines, extra_args=(), timeout=60):
    """A real victoria-metrics on a free loopback port with `lines` (Prometheus text with millisecond timestamps)
    imported and flushed; yields its URL and stops it afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = "http://127.0.0.1:%d" % port
    process = subprocess.Popen([str(tool("victoria-metrics")), "-storageDataPath=%s" % data_dir,
                                "-httpListenAddr=127.0.0.1:%d" % port, "-search.latencyOffset=0s",
                                "-loggerLevel=ERROR"] + list(extra_args),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()
                assert time.time() < deadline, "victoria-metrics did not start"
                time.sleep(0.2)
        request = urllib.request.Request(url + "/api/v1/import/prometheus", data="\n".join(lines).encode(),
                                         method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass
        with urllib.request.urlopen(url + "/internal/force_flush", timeout=10):
            pass
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def exposition_server(text: str):
    """A scrape target on a free loopback port answering every GET with `text` (Prometheus text format); yields its
    host:port and stops afterwards."""
    import http.server
    import threading

    body = text.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server interface
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield "127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def render_scrape_config(work: Path, inventory: dict, extra_vars: dict) -> Path:
    """The victoriametrics role's scrape.yml and file_sd/<job>.json for `inventory`, rendered on localhost by the
    role's own templates with its defaults and internal variables (its first management host renders them);
    `extra_vars` (-e) on top. Returns the directory holding them (credentials.json: the credentials the role would
    install)."""
    import yaml

    role = REPO / "roles" / "victoriametrics"
    out = work / "etc"
    work.mkdir(parents=True, exist_ok=True)
    (work / "inventory.yml").write_text(yaml.safe_dump(inventory))
    management = sorted(inventory["all"]["children"]["management"]["hosts"])[0]
    playbook = [{
        "name": "Render the victoriametrics scrape configuration",
        "hosts": management,
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")],
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [
            {"name": "Directory", "ansible.builtin.file": {"path": str(out / "file_sd"), "state": "directory",
                                                           "mode": "0755"}},
            {"name": "Target files", "ansible.builtin.template": {
                "src": str(role / "templates" / "file_sd.json.j2"),
                "dest": str(out / "file_sd") + "/{{ item.key }}.json", "mode": "0644"},
             "loop": "{{ _victoriametrics_jobs }}"},
            {"name": "Scrape configuration", "ansible.builtin.template": {
                "src": str(role / "templates" / "scrape.yml.j2"), "dest": str(out / "scrape.yml"), "mode": "0644"}},
            {"name": "Credentials the role installs", "ansible.builtin.copy": {
                "content": "{{ (['victoriametrics-client', 'victoriametrics-admin'] + _victoriametrics_scraped_credentials)"
                           " | to_json }}", "dest": str(out / "credentials.json"), "mode": "0644"}},
        ],
    }]
    (work / "render.yml").write_text(yaml.safe_dump(playbook))
    beside = Path(sys.executable).parent / "ansible-playbook"
    command = [str(beside) if beside.exists() else "ansible-playbook", "-i", str(work / "inventory.yml"),
               str(work / "render.yml"), "-e", json.dumps({"victoriametrics_config_dir": str(out), **extra_vars})]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def jsonargs_module(path: Path) -> bytes:
    """A JSONARGS module's text (roles/*/library): asserts Ansible will send it as one (its marker kept, no
    module_utils import that would make it an AnsiballZ payload)."""
    from ansible.executor import module_common
    source = Path(path).read_bytes()
    assert module_common.REPLACER_JSONARGS in source, "%s lost the JSONARGS marker" % path
    assert not module_common.NEW_STYLE_PYTHON_MODULE_RE.search(source), \
        "%s imports module_utils, which makes it an AnsiballZ module" % path
    return source


# Code for run_jsonargs_module's `probe`: writes to stderr the sorted names of the `ansible*` modules imported by then.
REPORT_ANSIBLE_IMPORTS = (b"import sys as _s\n"
                          b"_s.stderr.write(repr(sorted(m for m in _s.modules if m.startswith('ansible'))))\n")


def run_jsonargs_module(source: bytes, arguments: dict, probe: bytes = b""):
    """Run a JSONARGS module as Ansible does: its text with the arguments put in where module_common puts them, piped
    to Python. `probe`: code run just before the module's main(). Returns (exit code, its JSON answer, stderr)."""
    from ansible.executor import module_common
    payload = json.dumps(arguments).encode()
    text = source.replace(module_common.REPLACER_COMPLEX, repr(payload).encode()).replace(
        module_common.REPLACER_JSONARGS, payload)
    if probe:
        text = text.replace(b'\nif __name__ == "__main__":', b"\n" + probe + b'\nif __name__ == "__main__":')
    result = subprocess.run([sys.executable], input=text, capture_output=True, timeout=60, check=False)
    return result.returncode, json.loads(result.stdout), result.stderr
