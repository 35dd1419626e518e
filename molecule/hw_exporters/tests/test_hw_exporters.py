"""Verify ipmi_exporter and smartctl_exporter as converged by their roles on both test hosts.

The binaries are the real ones from the bundle; FreeIPMI, smartmontools and the BMC simulator (OpenIPMI's ipmi_sim,
host hw_exporters-bmc) are Debian's. The containers have no /dev/ipmi0 and no disks.

The site's security switch is on in this scenario: smartctl_exporter serves HTTPS with basic auth itself
(--web.config.file), ipmi_exporter (remote modules here) through its front (vmauth with TLS and one user); every
request below is made as a client must, trusting the site CA and presenting the component's credential (copied from
the controller's site PKI into a root-only file of the test host, never on a command line).
"""
import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hostchecks import main_pid

testinfra_hosts = ["podman://hw_exporters-debian12", "podman://hw_exporters-debian13"]

BMC = "hw_exporters-bmc"
PASSWORD = "hpcobs-BMC-7c1f"  # the scenario's test credential (molecule.yml)
ROTATED = "rotated-BMC-9d2e"
SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT_USER = "hpcobs"
# where a client on the test host finds the site CA (the roles put it beside each service's certificate) and where the
# tests keep each component's client credential (root only)
IPMI_CA = "/etc/ipmi_exporter/tls/ca.crt"
SMART_CA = "/etc/smartctl_exporter/tls/ca.crt"
CREDENTIALS = "/root/hpcobs-hw-tests"
IPMI_PW = CREDENTIALS + "/ipmi-exporter-client"
SMART_PW = CREDENTIALS + "/smartctl-exporter-client"
IPMI = "https://127.0.0.1:9290"
SMART = "https://127.0.0.1:9633"

# argv: url, CA file, user, password file (- for none); status 0 when nothing answered (a refused handshake too: the
# body says why)
_FETCH = ("import base64,ssl,sys,urllib.request,urllib.error\n"
          "url,ca,user,pwfile,timeout=sys.argv[1:6]\n"
          "ctx=ssl.create_default_context(cafile=None if ca=='-' else ca)\n"
          "headers={}\n"
          "if user!='-': headers['Authorization']='Basic '+base64.b64encode((user+':'+open(pwfile).read().strip())"
          ".encode()).decode()\n"
          "try:\n"
          "    r=urllib.request.urlopen(urllib.request.Request(url,headers=headers),timeout=float(timeout),context=ctx)\n"
          "    code,body=r.status,r.read()\n"
          "except urllib.error.HTTPError as e:\n"
          "    code=e.code\n"
          "    try: body=e.read()\n"
          "    except OSError: body=b''\n"
          "except OSError as e:\n"
          "    code,body=0,str(e).encode()\n"
          "sys.stdout.write('%d\\n' % code + body.decode('utf-8','replace'))\n")


def pki_file(relative):
    """A file of the scenario's site PKI on the controller (roles/pki, hpcobs_pki_dir in molecule.yml)."""
    directory = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY")
    assert directory, "run through molecule verify (MOLECULE_EPHEMERAL_DIRECTORY)"
    return (Path(directory) / "pki" / relative).read_text().strip()


def write_file(host, path, content, mode="0600"):
    """Write a file in the test host (its directory root only)."""
    host.check_output("install -d -m 0700 %s && echo %s | base64 -d > %s && chmod %s %s" % (
        quote(os.path.dirname(path)), base64.b64encode(content.encode()).decode(), quote(path), mode, quote(path)))


def install_credentials(host):
    """Each component's client credential, from the controller's PKI into a root-only file of the test host."""
    for name in ("ipmi-exporter-client", "smartctl-exporter-client"):
        path = "%s/%s" % (CREDENTIALS, name)
        if not host.file(path).exists:
            write_file(host, path, pki_file("credentials/" + name))


@pytest.fixture(autouse=True)
def client_credentials(host):
    install_credentials(host)


def fetch(host, url, ca="-", user="-", password_file="-", timeout=60):
    """(status, body) of a GET from inside the test host."""
    out = host.check_output("python3 -c %s %s" % (quote(_FETCH), " ".join(
        quote(str(word)) for word in (url, ca, user, password_file, timeout))))
    status, _, body = out.partition("\n")
    return int(status), body


def get(host, url, timeout=60):
    """(status, body) of a GET as the stack's client: the site CA and the component's credential (by its port)."""
    if url.startswith("https://") and ":9633" in url:
        return fetch(host, url, SMART_CA, CLIENT_USER, SMART_PW, timeout)
    if url.startswith("https://"):
        return fetch(host, url, IPMI_CA, CLIENT_USER, IPMI_PW, timeout)
    return fetch(host, url, timeout=timeout)


def quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def value(body, series):
    """Value of one exact series (name{labels}) in an exposition, or None."""
    match = re.search(r"^%s (\S+)$" % re.escape(series), body, re.M)
    return None if match is None else float(match.group(1))


def status_field(host, pid, field):
    return re.search(r"^%s:\s*(\S+)" % field, host.file("/proc/%s/status" % pid).content_string, re.M).group(1)


def remote(host, module, target=BMC):
    return get(host, IPMI + "/ipmi?target=%s&module=%s" % (target, module))


# --- both exporters: services, users, privileges ---------------------------------------------------------------

@pytest.mark.parametrize("unit", ["ipmi_exporter.service", "ipmi_exporter-local.socket", "ipmi_exporter-front.service",
                                  "smartctl_exporter.service", "smartctl_exporter-smartctl.socket"])
def test_units_enabled_and_active(host, unit):
    assert host.check_output("systemctl is-enabled %s" % unit).strip() == "enabled"
    assert host.check_output("systemctl is-active %s" % unit).strip() == "active"


@pytest.mark.parametrize("unit,user", [("ipmi_exporter", "ipmi_exporter"), ("ipmi_exporter-front", "ipmi_exporter"),
                                       ("smartctl_exporter", "smartctl_exporter")])
def test_exporter_runs_unprivileged(host, unit, user):
    pid = main_pid(host, unit)
    assert host.check_output("ps -o user= -p %s" % pid).strip() == user
    account = host.user(user)
    # made by roles/service's account (hpcobs_files): a system user in its own group, no home, no shell
    assert account.shell == "/usr/sbin/nologin" and account.home == "/nonexistent"
    assert account.group == user and account.uid < 1000 and account.gecos.endswith("(hpcobs)")
    assert not host.file("/nonexistent").exists
    # no capability at all, in any set, and it can never gain one
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status_field(host, pid, field), 16) == 0, field
    assert status_field(host, pid, "NoNewPrivs") == "1"
    assert status_field(host, pid, "Uid") != "0"


@pytest.mark.parametrize("unit,bounding,devices", [
    ("ipmi_exporter-local@probe.service", "", ["char-ipmidev rw"]),
    ("smartctl_exporter-smartctl@probe.service", "cap_sys_rawio cap_sys_admin",
     ["block-sd r", "block-blkext r", "char-nvme r", "char-sg r"]),
])
def test_root_helpers_are_confined(host, unit, bounding, devices):
    def show(prop):
        return host.check_output("systemctl show -p %s --value %s" % (prop, unit)).strip()
    assert show("CapabilityBoundingSet") == bounding
    assert show("AmbientCapabilities") == ""
    assert show("NoNewPrivileges") == "yes"
    assert show("PrivateNetwork") == "yes"
    assert show("ProtectSystem") == "strict"
    assert show("DevicePolicy") == "closed"
    allowed = show("DeviceAllow")
    for entry in devices:
        assert entry in allowed


@pytest.mark.parametrize("socket,group", [("/run/ipmi_exporter-local.sock", "ipmi_exporter"),
                                          ("/run/smartctl_exporter-smartctl.sock", "smartctl_exporter")])
def test_helper_sockets_only_for_the_exporter_group(host, socket, group):
    sock = host.file(socket)
    assert sock.is_socket
    assert (sock.user, sock.group, sock.mode) == ("root", group, 0o660)
    # another unprivileged account cannot use the helper
    out = host.run("runuser -u nobody -- python3 -c %s %s" % (
        quote("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])"), socket))
    assert out.rc != 0 and "Permission denied" in out.stderr


# --- ipmi_exporter: local BMC -------------------------------------------------------------------------------------

def test_binary_is_the_bundled_ipmi_exporter(host):
    out = host.run("/usr/local/bin/ipmi_exporter --version")
    assert "version 1.10.1" in out.stdout + out.stderr


def test_the_kernel_ipmi_drivers_are_listed_for_boot(host):
    drivers = host.file("/etc/modules-load.d/ipmi_exporter.conf")
    assert drivers.user == "root" and drivers.mode == 0o644
    assert [line for line in drivers.content_string.splitlines() if line and not line.startswith("#")] == [
        "ipmi_si", "ipmi_devintf"]


def test_local_mode_reports_missing_ipmi_device(host):
    assert not host.file("/dev/ipmi0").exists
    status, body = get(host, IPMI + "/metrics")
    assert status == 200
    assert "ipmi_exporter_build_info{" in body
    for collector in ("ipmi", "dcmi", "bmc", "chassis", "sel"):
        assert value(body, 'ipmi_up{collector="%s"}' % collector) == 0, collector
    # the FreeIPMI tools did run as root in the helper (not "permission denied") and say why they failed
    log = host.check_output("journalctl -u ipmi_exporter --no-pager -n 200")
    assert "device not found" in log
    assert "this host has no IPMI device (/dev/ipmi0" in log
    assert "permission denied" not in log.lower()


def test_local_helper_refuses_anything_but_read_only_queries(host):
    script = ("import json,socket,sys\n"
              "s=socket.socket(socket.AF_UNIX); s.connect('/run/ipmi_exporter-local.sock')\n"
              "s.sendall(json.dumps({'tool': sys.argv[1], 'flags': sys.argv[2:]}).encode()+b'\\n')\n"
              "s.shutdown(socket.SHUT_WR); data=b''\n"
              "while True:\n"
              "    c=s.recv(65536)\n"
              "    if not c: break\n"
              "    data+=c\n"
              "print(data.decode())\n")
    for request in ("ipmi-chassis --chassis-control=power-down", "ipmi-raw 0x00 0x02 0x02",
                    "bmc-info -h hw_exporters-bmc", "ipmi-sensors --config-file=/etc/shadow", "sh -c id"):
        out = host.check_output("runuser -u ipmi_exporter -- python3 -c %s %s" % (quote(script), request))
        answer = json.loads(out)
        assert answer["rc"] == 2 and "refused" in answer["output"], request
    # an allowed query does reach FreeIPMI (which finds no device here)
    out = host.check_output("runuser -u ipmi_exporter -- python3 -c %s ipmi-chassis --get-chassis-status"
                            % quote(script))
    answer = json.loads(out)
    assert answer["rc"] != 0 and "device not found" in answer["output"]


def test_local_module_uses_the_helper(host):
    config = host.file("/etc/ipmi_exporter/ipmi_exporter.yml")
    assert (config.user, config.group, config.mode) == ("ipmi_exporter", "ipmi_exporter", 0o600)
    text = config.content_string
    assert "/usr/local/libexec/hpcobs/ipmi_exporter-local" in text
    assert "opensesspriv" in text


# --- ipmi_exporter: remote BMCs -----------------------------------------------------------------------------------

def test_remote_bmc_is_read(host):
    status, body = remote(host, "bmcsim")
    assert status == 200
    for collector in ("ipmi", "bmc", "chassis", "sel"):
        assert value(body, 'ipmi_up{collector="%s"}' % collector) == 1, collector
    assert value(body, 'ipmi_fan_speed_rpm{id="3",name="Fan1A"}') == 4800
    assert value(body, 'ipmi_fan_speed_state{id="3",name="Fan1A"}') == 0
    assert value(body, 'ipmi_fan_speed_state{id="4",name="Fan2A"}') == 2
    assert value(body, 'ipmi_sensor_state{id="5",name="PS1 Status",type="Power Supply"}') == 0
    assert value(body, 'ipmi_sensor_state{id="6",name="PS2 Status",type="Power Supply"}') == 2
    assert value(body, 'ipmi_temperature_celsius{id="2",name="Inlet Temp"}') == 25
    assert re.search(r'^ipmi_bmc_info\{.*manufacturer_id="MontaVista Software, Inc\. \(4753\)".*\} 1$', body, re.M)


def test_wrong_password_fails_alone(host):
    status, body = remote(host, "wrongpass", target=BMC + "-wrongpass")
    assert status == 200
    assert value(body, 'ipmi_up{collector="ipmi"}') == 0
    assert value(body, 'ipmi_up{collector="bmc"}') == 0
    assert "ipmi_fan_speed_state" not in body
    # the good module still works right after
    assert value(remote(host, "bmcsim")[1], 'ipmi_up{collector="ipmi"}') == 1


def test_unreachable_bmc_fails_alone(host):
    # the other test host: reachable on the network, no BMC listening
    other = "hw_exporters-debian13" if "debian12" in host.backend.name else "hw_exporters-debian12"
    started = time.time()
    status, body = remote(host, "bmcsim", target=other)
    assert status == 200
    assert value(body, 'ipmi_up{collector="ipmi"}') == 0
    assert time.time() - started < 45  # the module's 3 s session timeout, per collector
    assert value(remote(host, "bmcsim")[1], 'ipmi_up{collector="ipmi"}') == 1


def test_unknown_module_is_rejected(host):
    # by the exporter itself (behind the front, on loopback)
    status, _ = get(host, "http://127.0.0.1:9291/ipmi?target=%s&module=no-such-module" % BMC)
    assert status == 400


def test_front_gives_each_bmc_its_own_module(host):
    # the inventory pairs the BMC's second name with the wrong password: asking for another module changes nothing
    status, body = remote(host, "bmcsim", target=BMC + "-wrongpass")
    assert status == 200 and value(body, 'ipmi_up{collector="ipmi"}') == 0
    status, body = remote(host, "wrongpass", target=BMC)
    assert status == 200 and value(body, 'ipmi_up{collector="ipmi"}') == 1


def test_exporter_listens_on_loopback_only_behind_the_front(host):
    listening = host.check_output("ss -Hltn")
    assert re.search(r"\s127\.0\.0\.1:9291\s", listening) and not re.search(r"(\*|0\.0\.0\.0|\[::\]):9291\s", listening)
    assert re.search(r"\s127\.0\.0\.1:9292\s", listening)  # the front's own /health, /metrics, /-/reload
    other = "hw_exporters-debian13" if "debian12" in host.backend.name else "hw_exporters-debian12"
    probe = ("import socket,sys\ns=socket.socket();s.settimeout(5)\n"
             "print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))")
    assert host.check_output("python3 -c %s %s 9291" % (quote(probe), other)) != "0"  # refused from another host
    assert host.check_output("python3 -c %s %s 9290" % (quote(probe), other)) == "0"  # the front answers


# The exporter would send the module's credentials to any target: only the inventory's BMCs get through the front.
# A UDP socket on 127.0.0.2:623 (the RMCP port) stands for an attacker's host and counts what reaches it.
NOT_LISTED = "127.0.0.2"
CATCHER = """
import base64, json, socket, ssl, sys, time, urllib.error, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2])
auth = "Basic " + base64.b64encode(("%s:%s" % (sys.argv[3], open(sys.argv[4]).read().strip())).encode()).decode()
catch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
catch.bind(("127.0.0.2", 623))
catch.setblocking(False)

def ask(url, timeout):
    secured = url.startswith("https://")
    request = urllib.request.Request(url, headers={"Authorization": auth} if secured else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context if secured else None) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return "timeout"

def caught(wait):
    count, end = 0, time.time() + wait
    while time.time() < end:
        try:
            catch.recv(4096)
            count += 1
        except BlockingIOError:
            time.sleep(0.1)
    return count

result = {}
for name, query in (("plain", "target=127.0.0.2&module=bmcsim"), ("other_module", "target=127.0.0.2&module=wrongpass"),
                    ("no_module", "target=127.0.0.2"), ("first_of_two", "target=127.0.0.2&target=%(bmc)s&module=bmcsim")):
    result["front_" + name] = ask("https://127.0.0.1:9290/ipmi?" + query % {"bmc": sys.argv[1]}, 60)
result["front_packets"] = caught(4)
# control: the exporter itself, asked directly, does send to it (so the catcher would have seen the front's)
result["direct"] = ask("http://127.0.0.1:9291/ipmi?target=127.0.0.2&module=bmcsim", 4)
result["direct_packets"] = caught(4)
print(json.dumps(result))
"""


def test_front_refuses_a_bmc_outside_the_allow_list_and_nothing_is_sent_to_it(host):
    result = json.loads(host.check_output("python3 -c %s %s %s %s %s" % (quote(CATCHER), BMC, IPMI_CA, CLIENT_USER,
                                                                          IPMI_PW)))
    assert result["front_plain"] == 400 and result["front_other_module"] == 400 and result["front_no_module"] == 400
    # a second, allowed target does not smuggle the first one through: the allowed BMC alone is asked
    assert result["front_first_of_two"] == 200
    assert result["front_packets"] == 0, result
    assert result["direct_packets"] > 0, result


def test_password_never_on_a_command_line_or_in_the_unit(host):
    assert PASSWORD in host.check_output("cat /etc/ipmi_exporter/ipmi_exporter.yml")
    assert PASSWORD not in host.check_output("systemctl cat ipmi_exporter.service")
    assert PASSWORD not in host.check_output("systemctl show ipmi_exporter.service")
    # watch every process's arguments while remote scrapes run FreeIPMI against the BMC
    watcher = ("import base64,ssl,subprocess,sys,time,urllib.request,threading\n"
               "seen=[]\n"
               "ctx=ssl.create_default_context(cafile=sys.argv[1])\n"
               "auth='Basic '+base64.b64encode((sys.argv[2]+':'+open(sys.argv[3]).read().strip()).encode()).decode()\n"
               "def scrape():\n"
               "    for _ in range(5):\n"
               "        urllib.request.urlopen(urllib.request.Request('https://127.0.0.1:9290/ipmi?target=%s&module=bmcsim',"
               "headers={'Authorization':auth}),timeout=60,context=ctx).read()\n"
               "t=threading.Thread(target=scrape); t.start(); n=0\n"
               "while t.is_alive():\n"
               "    out=subprocess.run(['ps','-eo','args'],capture_output=True,text=True).stdout\n"
               "    n+=1\n"
               "    seen+=[l for l in out.splitlines() if 'ipmimonitoring' in l or 'ipmi-sensors' in l"
               " or 'bmc-info' in l]\n"
               "    time.sleep(0.02)\n"
               "print(n); print('\\n'.join(seen))\n" % BMC)
    out = host.check_output("python3 -c %s %s %s %s" % (quote(watcher), IPMI_CA, CLIENT_USER, IPMI_PW))
    samples, _, seen = out.partition("\n")
    assert int(samples) > 0
    assert "--config-file /tmp/ipmi_exporter-" in seen  # FreeIPMI was caught running, settings via the FIFO
    assert PASSWORD not in out
    assert PASSWORD not in host.check_output("journalctl -u ipmi_exporter --no-pager -n 500")


def test_ansible_output_never_shows_the_password(host):
    """Run the role's checks and configuration in check+diff mode with a changed module: nothing may print it."""
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE")
    assert inventory and os.path.exists(inventory), "run through molecule verify (MOLECULE_INVENTORY_FILE)"
    name = host.backend.name
    extra = {"ipmi_exporter_remote_modules": {
        "bmcsim": {"user": "monitor", "pass": PASSWORD, "collectors": ["ipmi"]},
        "rotated": {"user": "monitor", "pass": ROTATED}}}
    play = os.path.join(SCENARIO, "check_secrets.yml")
    project = os.path.dirname(os.path.dirname(SCENARIO))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=os.path.join(project, "roles"),
               ANSIBLE_FILTER_PLUGINS=os.path.join(project, "playbooks", "filter_plugins"))
    env.setdefault("ANSIBLE_CONFIG", os.path.join(project, "ansible.cfg"))
    result = subprocess.run(["ansible-playbook", "-i", inventory, play, "--check", "--diff", "-v", "--limit", name,
                             "-e", json.dumps(extra)], capture_output=True, text=True, timeout=600, check=False,
                            env=env, cwd=project)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Write the ipmi_exporter configuration" in output
    assert "changed: [%s]" % name in output  # the configuration would change: the diff path was exercised
    assert PASSWORD not in output
    assert ROTATED not in output


# --- smartctl_exporter ----------------------------------------------------------------------------------------------

def test_binary_is_the_bundled_smartctl_exporter(host):
    out = host.run("/usr/local/bin/smartctl_exporter --help")
    assert "--smartctl.device-exclude" in out.stdout + out.stderr


def test_smartctl_exporter_serves_metrics_without_disks(host):
    status, body = get(host, SMART + "/metrics")
    assert status == 200
    assert "smartctl_exporter_build_info{" in body
    assert value(body, "smartctl_devices") == 0
    # the startup scan went through the helper (smartctl as root in the sandbox) and found nothing
    log = host.check_output("journalctl -u smartctl_exporter --no-pager -n 200")
    assert 'msg="Number of devices found" count=0' in log
    assert "S.M.A.R.T. output reading error" not in log


def test_device_filter_reaches_the_exporter_verbatim(host):
    args = host.file("/proc/%s/cmdline" % main_pid(host, "smartctl_exporter")).content_string.split("\0")
    assert "--smartctl.device-exclude=^/dev/(loop|ram)[0-9]+$" in args
    assert "--smartctl.path=/usr/local/libexec/hpcobs/smartctl_exporter-smartctl-client" in args


def test_smartctl_helper_runs_smartctl_as_root(host):
    client = "/usr/local/libexec/hpcobs/smartctl_exporter-smartctl-client"
    out = host.run("runuser -u smartctl_exporter -- %s --json --scan" % client)
    assert out.rc == 0, out.stderr
    scan = json.loads(out.stdout)
    assert scan["smartctl"]["exit_status"] == 0
    assert scan.get("devices", []) == []  # no disks in a container
    # a device read: /dev/null is no disk, but smartctl answers with its version block (what becomes
    # smartctl_version once a real disk is read)
    # (smartctl_exporter 0.14's exact device read, as it runs it)
    out = host.run("runuser -u smartctl_exporter -- %s --json --info --health --attributes --tolerance=verypermissive"
                   " --nocheck=standby --format=brief --log=error --device=auto /dev/null" % client)
    answer = json.loads(out.stdout)
    assert answer["smartctl"]["version"][0] == 7
    assert answer["smartctl"]["exit_status"] != 0


@pytest.mark.parametrize("args", ["--json --scan-open", "--set=standby,now /dev/sda", "-t long /dev/sda",
                                  "--json --info --health --attributes --tolerance=verypermissive --nocheck=standby"
                                  " --format=brief --log=error --device=auto /dev/../etc/shadow"])
def test_smartctl_helper_refuses_other_invocations(host, args):
    script = ("import json,socket,sys\n"
              "s=socket.socket(socket.AF_UNIX); s.connect('/run/smartctl_exporter-smartctl.sock')\n"
              "s.sendall(json.dumps({'args': sys.argv[1:]}).encode()+b'\\n'); s.shutdown(socket.SHUT_WR)\n"
              "print(s.recv(65536).decode())\n")
    out = host.check_output("runuser -u smartctl_exporter -- python3 -c %s %s" % (quote(script), args))
    assert json.loads(out) == {"rc": 2, "output": ""}


# --- the security switch: HTTPS from the site CA, basic auth of the client user ------------------------------------

@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A CA that is not the site's (made with the controller's openssl, as roles/pki makes the site's)."""
    work = tmp_path_factory.mktemp("other-ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=not the site CA"],
                   check=True, capture_output=True, cwd=work)
    return (work / "ca.crt").read_text()


def other_host(host):
    return "hw_exporters-debian13" if "debian12" in host.backend.name else "hw_exporters-debian12"


# what a scrape asks: the exporters' /metrics and, through the front, an allow-listed BMC
SECURED = [("smartctl", "9633", "/metrics", SMART_CA, SMART_PW, "smartctl_exporter_build_info{"),
           ("ipmi front", "9290", "/metrics", IPMI_CA, IPMI_PW, "ipmi_exporter_build_info{"),
           ("ipmi front", "9290", "/ipmi?target=%s&module=bmcsim" % BMC, IPMI_CA, IPMI_PW, 'ipmi_up{collector="ipmi"} 1')]


@pytest.mark.parametrize("what,port,path,ca,password_file,expected", SECURED)
def test_secured_endpoint_refuses_clients_without_the_credential(host, what, port, path, ca, password_file, expected):
    # from the other test host, as any client on the network: at the host's name, which its certificate carries
    client = host.get_host("podman://" + other_host(host))
    install_credentials(client)
    url = "https://%s:%s%s" % (host.backend.name, port, path)
    status, body = fetch(client, url, ca)
    assert status == 401, (what, status, body[:300])
    write_file(client, CREDENTIALS + "/wrong", "wrong-" + pki_file("credentials/" + os.path.basename(password_file)))
    status, body = fetch(client, url, ca, CLIENT_USER, CREDENTIALS + "/wrong")
    assert status == 401, (what, status, body[:300])
    # another component's credential is no credential here either
    other = SMART_PW if password_file == IPMI_PW else IPMI_PW
    status, body = fetch(client, url, ca, CLIENT_USER, other)
    assert status == 401, (what, status, body[:300])
    # plain HTTP gets nothing (both answer HTTP on their TLS port with 400)
    status, body = fetch(client, url.replace("https://", "http://"))
    assert status == 400 and expected not in body, (what, status, body[:300])
    # the site CA and the credential: the metrics
    status, body = fetch(client, url, ca, CLIENT_USER, password_file)
    assert status == 200 and expected in body, (what, status, body[:300])


@pytest.mark.parametrize("what,port,path,ca,password_file,expected", SECURED)
def test_secured_endpoint_chains_to_the_site_ca_only(host, other_ca, what, port, path, ca, password_file, expected):
    write_file(host, CREDENTIALS + "/other-ca.crt", other_ca, "0644")
    status, body = fetch(host, "https://127.0.0.1:%s%s" % (port, path), CREDENTIALS + "/other-ca.crt", CLIENT_USER,
                         password_file)
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in body, (what, status, body[:300])


@pytest.mark.parametrize("path,owner,group,mode", [
    ("/etc/smartctl_exporter", "root", "smartctl_exporter", 0o750),
    ("/etc/smartctl_exporter/web.yml", "root", "smartctl_exporter", 0o640),
    ("/etc/smartctl_exporter/tls", "root", "smartctl_exporter", 0o750),
    ("/etc/smartctl_exporter/tls/server.key", "root", "smartctl_exporter", 0o640),
    ("/etc/smartctl_exporter/tls/server.crt", "root", "smartctl_exporter", 0o644),
    ("/etc/smartctl_exporter/tls/ca.crt", "root", "smartctl_exporter", 0o644),
    ("/etc/ipmi_exporter/front.yml", "root", "ipmi_exporter", 0o640),
    ("/etc/ipmi_exporter/tls", "root", "ipmi_exporter", 0o750),
    ("/etc/ipmi_exporter/tls/server.key", "root", "ipmi_exporter", 0o640),
    ("/etc/ipmi_exporter/tls/server.crt", "root", "ipmi_exporter", 0o644),
])
def test_security_files_are_readable_by_the_service_only(host, path, owner, group, mode):
    entry = host.file(path)
    assert entry.exists, path
    assert (entry.user, entry.group, entry.mode) == (owner, group, mode), path


def test_the_web_configuration_holds_only_the_hash(host):
    password = pki_file("credentials/smartctl-exporter-client")
    text = host.check_output("cat /etc/smartctl_exporter/web.yml")
    assert password not in text
    assert re.search(r"^  hpcobs: \$2[aby]\$10\$[./A-Za-z0-9]{53}$", text, re.M), text
    assert "cert_file: /etc/smartctl_exporter/tls/server.crt" in text
    args = host.file("/proc/%s/cmdline" % main_pid(host, "smartctl_exporter")).content_string.split("\0")
    assert "--web.config.file=/etc/smartctl_exporter/web.yml" in args
    assert password not in host.check_output("systemctl cat smartctl_exporter.service")


def test_the_ipmi_front_serves_tls_and_the_exporter_behind_it_stays_plain(host):
    front = host.check_output("systemctl cat ipmi_exporter-front.service")
    for flag in ("-tls", "-tlsCertFile=/etc/ipmi_exporter/tls/server.crt", "-tlsKeyFile=/etc/ipmi_exporter/tls/server.key",
                 "-tlsMinVersion=TLS12"):
        assert re.search(r"(^|\s)%s(\s|$)" % re.escape(flag), front, re.M), flag
    password = pki_file("credentials/ipmi-exporter-client")
    assert password not in front
    assert password not in host.check_output("systemctl show ipmi_exporter-front.service")
    # the exporter on loopback: no web configuration of its own (the front authenticates), plain HTTP
    args = host.file("/proc/%s/cmdline" % main_pid(host, "ipmi_exporter")).content_string.split("\0")
    assert not [arg for arg in args if arg.startswith("--web.config.file")]
    assert not host.file("/etc/ipmi_exporter/web.yml").exists
    status, body = fetch(host, "http://127.0.0.1:9291/metrics")
    assert status == 200 and "ipmi_exporter_build_info{" in body
    # the front's own /health (loopback) is HTTPS too: vmauth's -tls covers it
    assert fetch(host, "https://127.0.0.1:9292/health", IPMI_CA) == (200, "OK")


def test_the_front_answers_an_authenticated_request_outside_the_allow_list_with_400(host):
    status, _ = get(host, IPMI + "/ipmi?target=127.0.0.2&module=bmcsim")
    assert status == 400
    status, _ = get(host, IPMI + "/-/reload")
    assert status == 400
