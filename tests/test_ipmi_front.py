"""roles/ipmi_exporter/filter_plugins/hpcobs_ipmi.py: the BMC allow-list of the remote mode and the vmauth routes
built from it (the routes' behaviour against the real vmauth and ipmi_exporter: molecule/hw_exporters)."""
import importlib.util
import os

import pytest
from tooling import tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "hpcobs_ipmi", os.path.join(ROOT, "roles", "ipmi_exporter", "filter_plugins", "hpcobs_ipmi.py"))
ipmi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ipmi)

MODULES = {"idrac": {"user": "u", "pass": "p"}, "ilo": {"user": "u", "pass": "p"}}
BACKEND = "127.0.0.1:9291"


def test_good_allow_list():
    assert ipmi.target_problems({"idrac": ["bmc-gpu01.mgmt", "10.1.2.3", "[fd00::7]:623", "bmc7:1623", "hw_bmc-1"],
                                 "ilo": []}, MODULES, BACKEND) == []
    assert ipmi.target_problems({}, {}, "") == []  # no remote mode: no front, any backend address


@pytest.mark.parametrize("targets,expected", [
    ([], "ipmi_exporter_remote_targets must map remote module names to lists of BMC addresses, got []"),
    ({"nope": ["b"]}, 'ipmi_exporter_remote_targets: "nope" is not a module of ipmi_exporter_remote_modules'),
    ({"idrac": "bmc1"}, 'ipmi_exporter_remote_targets["idrac"] must be a list of BMC addresses, got "bmc1"'),
    ({"idrac": ["bmc1&target=evil"]}, 'ipmi_exporter_remote_targets["idrac"]: "bmc1&target=evil" is not a BMC'),
    ({"idrac": ["bmc 1"]}, 'is not a BMC host name or address'),
    ({"idrac": ["http://bmc1"]}, 'is not a BMC host name or address'),
    ({"idrac": ["-hbmc"]}, 'is not a BMC host name or address'),
    ({"idrac": [7]}, 'ipmi_exporter_remote_targets["idrac"]: 7 is not a BMC'),
    ({"idrac": ["bmc1"], "ilo": ["bmc1"]}, "BMC bmc1 is listed under idrac and ilo"),
])
def test_bad_allow_list_is_named(targets, expected):
    found = ipmi.target_problems(targets, MODULES, BACKEND)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("backend", ["0.0.0.0:9291", ":9291", "10.0.0.5:9291", "127.0.0.1", "[::]:9291"])
def test_the_exporter_behind_the_front_stays_on_loopback(backend):
    found = ipmi.target_problems({}, MODULES, backend)
    assert len(found) == 1 and found[0].startswith("ipmi_exporter_backend_listen_address must be a loopback address")


def test_routes_pass_metrics_and_each_listed_bmc_with_its_own_module():
    config = ipmi.front_config({"idrac": ["bmc-gpu01", "[fd00::7]:623"], "ilo": ["10.1.2.3"]}, BACKEND)
    assert config == {"unauthorized_user": {"url_map": [
        {"src_paths": ["/metrics"], "url_prefix": "http://127.0.0.1:9291"},
        {"src_paths": ["/ipmi"], "src_query_args": ["target=bmc-gpu01"],
         "url_prefix": "http://127.0.0.1:9291?module=idrac&target=bmc-gpu01"},
        {"src_paths": ["/ipmi"], "src_query_args": ["target=[fd00::7]:623"],
         "url_prefix": "http://127.0.0.1:9291?module=idrac&target=%5Bfd00%3A%3A7%5D%3A623"},
        {"src_paths": ["/ipmi"], "src_query_args": ["target=10.1.2.3"],
         "url_prefix": "http://127.0.0.1:9291?module=ilo&target=10.1.2.3"},
    ]}}


def test_no_listed_bmc_passes_only_metrics():
    assert ipmi.front_config({}, BACKEND) == {"unauthorized_user": {"url_map": [
        {"src_paths": ["/metrics"], "url_prefix": "http://127.0.0.1:9291"}]}}


def test_unchecked_targets_are_refused():
    with pytest.raises(ipmi.AnsibleFilterError):
        ipmi.front_config({"idrac": ["a&b"]}, BACKEND)
    with pytest.raises(ipmi.AnsibleFilterError):
        ipmi.front_config({}, "0.0.0.0:9291")


PASSWORD = "x" * 12 + "-client-pw-1234"


def test_under_the_security_switch_the_routes_belong_to_the_client_user():
    config = ipmi.front_config({"idrac": ["bmc-gpu01"]}, BACKEND, "hpcobs", PASSWORD + "\n")
    assert config == {"users": [{"username": "hpcobs", "password": PASSWORD, "url_map": [
        {"src_paths": ["/metrics"], "url_prefix": "http://127.0.0.1:9291"},
        {"src_paths": ["/ipmi"], "src_query_args": ["target=bmc-gpu01"],
         "url_prefix": "http://127.0.0.1:9291?module=idrac&target=bmc-gpu01"},
    ]}]}
    assert "unauthorized_user" not in config  # nobody else gets anywhere


@pytest.mark.parametrize("user,password", [("hpcobs", ""), ("hpcobs", "short"), ("hpcobs", "a" * 16 + "\nb"),
                                           ("bad user", PASSWORD), ("a:b", PASSWORD)])
def test_a_bad_client_user_or_credential_is_refused_without_showing_it(user, password):
    with pytest.raises(ipmi.AnsibleFilterError) as error:
        ipmi.front_config({}, BACKEND, user, password)
    assert not password or password not in str(error.value)


@pytest.fixture(scope="module")
def vmauth():
    # the test tools' vmauth; the test fails when there is none (make tools)
    return str(tool("vmauth"))


def test_real_vmauth_accepts_the_secured_config(vmauth, tmp_path):
    import subprocess

    import yaml
    path = tmp_path / "front.yml"
    path.write_text(yaml.safe_dump(ipmi.front_config({"idrac": ["bmc-gpu01", "10.1.2.3"]}, BACKEND, "hpcobs",
                                                     PASSWORD)))
    proc = subprocess.run([vmauth, "-auth.config=%s" % path, "-dryRun", "-loggerLevel=ERROR"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and refuses a broken one (the check can fail)
    path.write_text("users:\n- username: hpcobs\n  password: x\n  url_map: [{src_paths: ['[']}]\n")
    proc = subprocess.run([vmauth, "-auth.config=%s" % path, "-dryRun", "-loggerLevel=ERROR"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode != 0
