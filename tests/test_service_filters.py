"""playbooks/filter_plugins/hpcobs_service.py: probe URLs, ports and ExecStart words, and the shared unit
template rendered with those filters."""
import importlib.util
import os
import shlex

import jinja2
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE = os.path.join(ROOT, "roles", "service")
spec = importlib.util.spec_from_file_location("hpcobs_service", os.path.join(ROOT, "playbooks", "filter_plugins",
                                                                             "hpcobs_service.py"))
service = importlib.util.module_from_spec(spec)
spec.loader.exec_module(service)


@pytest.mark.parametrize("listen,url", [
    (":9100", "http://127.0.0.1:9100/metrics"),
    ("0.0.0.0:9290", "http://127.0.0.1:9290/metrics"),
    ("[::]:9633", "http://127.0.0.1:9633/metrics"),
    ("10.1.2.3:9400", "http://10.1.2.3:9400/metrics"),
    ("[::1]:8428", "http://[::1]:8428/metrics"),
    ("node01.example:9100", "http://node01.example:9100/metrics"),
])
def test_probe_url_reaches_the_service_from_its_own_host(listen, url):
    assert service.probe_url(listen, "/metrics") == url


def test_probe_url_with_tls_and_path():
    assert service.probe_url(":8428", "/health", tls=True) == "https://127.0.0.1:8428/health"
    assert service.probe_url("[::]:3100", "") == "http://127.0.0.1:3100"
    with pytest.raises(service.AnsibleFilterError, match="must start with /"):
        service.probe_url(":8428", "health")


@pytest.mark.parametrize("listen", ["9100", ":0", ":65536", "host:port", "[zz]:1", "a b:1", "", ":9100 "])
def test_invalid_listen_addresses_are_named(listen):
    assert "is not a listen address" in service.listen_problem(listen)
    with pytest.raises(service.AnsibleFilterError):
        service.listen_port(listen)
    with pytest.raises(service.AnsibleFilterError):
        service.probe_host(listen)


def test_valid_listen_address_and_port():
    assert service.listen_problem("[::1]:65535") == ""
    assert service.listen_port("[::1]:65535") == 65535
    assert service.probe_host(":1") == "127.0.0.1"


@pytest.mark.parametrize("word", [
    "--web.listen-address=:9100", "--a=b c", 'say "hi"', "100%", "$HOME", "back\\slash", "semi;colon", "",
])
def test_systemd_word_reads_back_as_the_same_argument(word):
    # systemd's ExecStart= unquoting of what this writes (quotes, backslash escapes, %% and $$), done here by hand.
    written = service.systemd_word(word)
    if written == word:
        assert " " not in word and word
        return
    assert written.startswith('"') and written.endswith('"')
    unquoted = shlex.split(written.replace("%%", "%").replace("$$", "$"))
    assert unquoted == [word]


def test_plain_words_stay_as_they_are_and_line_breaks_are_refused():
    assert service.systemd_word("--collector.systemd") == "--collector.systemd"
    with pytest.raises(service.AnsibleFilterError, match="line break"):
        service.systemd_word("a\nExecStartPre=/bin/sh")


def defaults():
    import yaml
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as handle:
        values = yaml.safe_load(handle)
    values.pop("service_unit_changed")
    return values


def render(**overrides):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")),
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters["hpcobs_systemd_word"] = service.systemd_word
    values = defaults()
    values.update(ansible_managed="managed", service_description="Test (hpcobs)", service_user="svc",
                  service_group="svc", service_exec="/usr/local/bin/svc")
    values.update(overrides)
    return env.get_template("service.service.j2").render(**values)


def directives(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_unit_defaults_are_the_hardened_baseline():
    lines = directives(render(service_args=["--listen=:1", "--label=a b"]))
    for expected in ("NoNewPrivileges=yes", "CapabilityBoundingSet=", "AmbientCapabilities=", "ProtectSystem=strict",
                     "ProtectHome=yes", "PrivateDevices=yes", "ProtectProc=invisible", "ProtectKernelLogs=yes",
                     "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
                     "Restart=on-failure", "WantedBy=multi-user.target"):
        assert expected in lines
    # the system-call filter only where the real program was run under it (service_syscall_filter: true)
    assert not [line for line in lines if line.startswith("SystemCallFilter")]
    assert "SystemCallFilter=@system-service" in directives(render(service_syscall_filter=True))
    assert "ExecStart=/usr/local/bin/svc \\" in lines
    assert '    "--label=a b"' in render(service_args=["--label=a b"]).splitlines()
    assert not [line for line in lines if line.startswith(("ExecReload", "DeviceAllow", "ReadWritePaths"))]


def test_unit_devices_capabilities_and_extra_directives():
    lines = directives(render(service_device_allow=["char-nvidia-frontend rw", "/dev/nvidiactl rw"],
                              service_capabilities=["CAP_SYS_ADMIN"], service_reload_signal="HUP",
                              service_read_write_paths=["/var/lib/svc"], service_protect_proc="",
                              service_syscall_filter=False, service_directives=["StateDirectory=svc"],
                              service_unit_directives=["Requires=x.socket"], service_after=["x.socket"]))
    assert "PrivateDevices=no" in lines and "DevicePolicy=closed" in lines
    assert "DeviceAllow=char-nvidia-frontend rw" in lines and "DeviceAllow=/dev/nvidiactl rw" in lines
    assert "PrivateDevices=yes" not in lines
    assert "CapabilityBoundingSet=CAP_SYS_ADMIN" in lines and "AmbientCapabilities=CAP_SYS_ADMIN" in lines
    assert "ExecReload=/bin/kill -HUP $MAINPID" in lines
    assert "ReadWritePaths=/var/lib/svc" in lines
    assert "StateDirectory=svc" in lines and "Requires=x.socket" in lines
    assert "After=network-online.target x.socket" in lines
    assert not [line for line in lines if line.startswith(("ProtectProc", "SystemCallFilter"))]


@pytest.mark.parametrize("host,port,listen", [
    ("", 9080, ":9080"), ("0.0.0.0", 9080, "0.0.0.0:9080"), ("::", 9080, "[::]:9080"), ("[::1]", 1, "[::1]:1"),
    ("10.0.0.1", "3100", "10.0.0.1:3100"),
])
def test_listen_join_gives_what_the_probe_reads(host, port, listen):
    assert service.listen_join(host, port) == listen
    assert service.listen_problem(listen) == ""


def test_metric_sum_adds_every_series_of_one_family_only():
    text = "\n".join([
        "# HELP promtail_journal_target_lines_total Total lines read.",
        "# TYPE promtail_journal_target_lines_total counter",
        "promtail_journal_target_lines_total 12",
        'loki_source_journal_target_lines_total{component_id="loki.source.journal.x"} 3 1700000000000',
        'loki_source_journal_target_lines_total{component_id="y"} 4.5e0',
        "loki_source_journal_target_lines_total_created 1.7e9",
        "broken_metric NaNish",
    ])
    assert service.metric_sum(text, "promtail_journal_target_lines_total") == 12
    assert service.metric_sum(text, "loki_source_journal_target_lines_total") == 7.5
    assert service.metric_sum(text, "absent_metric") == 0.0
    assert service.metric_sum(text, "broken_metric") == 0.0
