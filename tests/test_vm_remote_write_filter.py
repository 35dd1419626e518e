"""The victoriametrics role's remote-write setting (filter_plugins/hpcobs_vm_remote_write.py): what its check refuses,
the files of the secrets it installs and vmagent's -remoteWrite.* flags. The real vmagent runs them in
tests/test_vmagent_remote_write.py."""
from __future__ import annotations

import importlib.util

import pytest

from tooling import REPO

spec = importlib.util.spec_from_file_location(
    "hpcobs_vm_remote_write", REPO / "roles" / "victoriametrics" / "filter_plugins" / "hpcobs_vm_remote_write.py")
rw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rw)

CLUSTER = "https://vminsert.example.org:8480/insert/0/prometheus/api/v1/write"
SECRETS = "/etc/victoriametrics/remote-write"
LOCAL_AUTH = {"username": "hpcobs", "password_file": "/etc/victoriametrics/tls/victoriametrics-client",
              "ca_file": "/etc/victoriametrics/tls/ca.crt"}


def problems(*entries):
    return rw.remote_write_problems(list(entries))


def test_empty_is_right():
    assert rw.remote_write_problems([]) == []
    assert rw.remote_write_problems(None) == []
    assert rw.remote_write_check([]) == []


def test_good_entries_pass():
    assert problems({"name": "site", "url": CLUSTER, "username": "hpcobs", "credential": "site-vminsert"},
                    {"name": "dr", "url": "http://[fd00::7]:8428/api/v1/write", "username": "a",
                     "password_file": "/srv/secrets/dr"},
                    {"name": "token", "url": "https://vm.example.org/api/v1/write",
                     "bearer_token_file": "/srv/secrets/token", "ca_file": "/srv/ca.crt"},
                    {"name": "plain", "url": "http://vm2:8428/api/v1/write"}) == []


@pytest.mark.parametrize("entry,expected", [
    ("https://x", "must be a map with name and url"),
    ({"url": CLUSTER}, "name must be lower-case"),
    ({"name": "Site", "url": CLUSTER}, "name must be lower-case"),
    ({"name": "local", "url": CLUSTER}, "the name local is the host's own VictoriaMetrics"),
    ({"name": "s"}, "url is required"),
    ({"name": "s", "url": "ftp://vm.example.org/write"}, "url must start with http:// or https://"),
    ({"name": "s", "url": "vm.example.org:8480/write"}, "url must start with http:// or https://"),
    ({"name": "s", "url": "https:///api/v1/write"}, "url needs a host name"),
    ({"name": "s", "url": "https://vm.example.org/write?token=abc"}, "no query or fragment"),
    ({"name": "s", "url": "https://vm.example.org/a b"}, "white space or a comma"),
    ({"name": "s", "url": "https://vm.example.org/a,b"}, "white space or a comma"),
    ({"name": "s", "url": "https://vm.example.org:99999/write"}, "not a valid URL"),
    ({"name": "s", "url": CLUSTER, "user": "x"}, "unknown key(s) user"),
    ({"name": "s", "url": CLUSTER, "username": "hpcobs"}, "username needs its password"),
    ({"name": "s", "url": CLUSTER, "credential": "c"}, "needs username"),
    ({"name": "s", "url": CLUSTER, "username": "u", "credential": "c", "password_file": "/p"},
     "password_file or credential, not both"),
    ({"name": "s", "url": CLUSTER, "username": "u", "credential": "c", "bearer_token_file": "/t"},
     "or bearer_token_file, not both"),
    ({"name": "s", "url": CLUSTER, "username": "u", "password_file": "secrets/p"}, "password_file must be an absolute"),
    ({"name": "s", "url": CLUSTER, "bearer_token_file": "t"}, "bearer_token_file must be an absolute"),
    ({"name": "s", "url": CLUSTER, "username": "u", "credential": "../ca"}, "credential must name a credential"),
    ({"name": "s", "url": CLUSTER, "username": "u x", "credential": "c"}, "username must be letters"),
    ({"name": "s", "url": CLUSTER, "ca_file": "ca.crt"}, "ca_file must be an absolute"),
    ({"name": "s", "url": CLUSTER, "ca_file": "/ca.crt", "site_ca": True}, "ca_file or site_ca, not both"),
    ({"name": "s", "url": CLUSTER, "site_ca": "yes"}, "site_ca must be true or false"),
    ({"name": "s", "url": "http://vm:8428/api/v1/write", "site_ca": True}, "are for an https:// URL"),
])
def test_each_problem_names_the_setting_and_the_entry(entry, expected):
    found = problems(entry)
    assert any(expected in line for line in found), found
    assert all(line.startswith("victoriametrics_remote_write[0]") for line in found), found


def test_a_url_with_credentials_is_refused_without_echoing_them():
    for url in ("https://user:s3cr3t-pass@vm.example.org/write", "ftp://user:s3cr3t-pass@vm.example.org/write",
                "https://user:s3cr3t-pass@vm.example.org/a b"):
        found = problems({"name": "s", "url": url})
        assert any("must not carry credentials" in line for line in found), found
        assert "s3cr3t-pass" not in " ".join(found)
    with pytest.raises(rw.AnsibleFilterError) as err:
        rw.remote_write_check([{"name": "s", "url": "https://u:s3cr3t-pass@vm/w"}])
    assert "s3cr3t-pass" not in str(err.value) and "Nothing was changed" in str(err.value)


def test_names_and_urls_are_unique():
    found = problems({"name": "a", "url": CLUSTER}, {"name": "a", "url": CLUSTER})
    assert any("(a): the name is used by an earlier entry" in line for line in found)
    assert any("url is given twice" in line for line in found)


def test_not_a_list():
    assert "must be a list" in rw.remote_write_problems({"name": "x"})[0]
    assert "must be a list" in rw.remote_write_problems("https://vm")[0]


def test_the_secrets_files_come_from_the_pki_or_the_named_files():
    entries = [{"name": "site", "url": CLUSTER, "username": "hpcobs", "credential": "site-vminsert"},
               {"name": "dr", "url": "https://dr/w", "username": "u", "password_file": "/srv/dr-pass",
                "ca_file": "/srv/dr-ca.crt"},
               {"name": "tok", "url": "https://t/w", "bearer_token_file": "/srv/token", "site_ca": True},
               {"name": "plain", "url": "http://p/w"}]
    assert rw.remote_write_files(entries, SECRETS, "/home/op/pki/") == [
        {"src": "/home/op/pki/credentials/site-vminsert", "dest": SECRETS + "/site.password", "mode": "0640"},
        {"src": "/srv/dr-pass", "dest": SECRETS + "/dr.password", "mode": "0640"},
        {"src": "/srv/dr-ca.crt", "dest": SECRETS + "/dr.ca.crt", "mode": "0640"},
        {"src": "/srv/token", "dest": SECRETS + "/tok.token", "mode": "0640"},
    ]
    assert rw.remote_write_files([], SECRETS, "/pki") == []


def test_flags_are_one_per_url_in_order_local_first_and_name_files_only():
    entries = [{"name": "site", "url": CLUSTER, "username": "cluster-user", "credential": "site-vminsert"},
               {"name": "tok", "url": "https://t/w", "bearer_token_file": "/srv/token", "site_ca": True},
               {"name": "plain", "url": "http://p/w"}]
    args = rw.vmagent_remote_write_args(entries, "https://127.0.0.1:8428", SECRETS, LOCAL_AUTH)
    assert args == [
        "-remoteWrite.url=https://127.0.0.1:8428/api/v1/write",
        "-remoteWrite.url=" + CLUSTER,
        "-remoteWrite.url=https://t/w",
        "-remoteWrite.url=http://p/w",
        "-remoteWrite.basicAuth.username=hpcobs",
        "-remoteWrite.basicAuth.username=cluster-user",
        "-remoteWrite.basicAuth.username=",
        "-remoteWrite.basicAuth.username=",
        "-remoteWrite.basicAuth.passwordFile=/etc/victoriametrics/tls/victoriametrics-client",
        "-remoteWrite.basicAuth.passwordFile=" + SECRETS + "/site.password",
        "-remoteWrite.basicAuth.passwordFile=",
        "-remoteWrite.basicAuth.passwordFile=",
        "-remoteWrite.bearerTokenFile=",
        "-remoteWrite.bearerTokenFile=",
        "-remoteWrite.bearerTokenFile=" + SECRETS + "/tok.token",
        "-remoteWrite.bearerTokenFile=",
        "-remoteWrite.tlsCAFile=/etc/victoriametrics/tls/ca.crt",
        "-remoteWrite.tlsCAFile=",
        "-remoteWrite.tlsCAFile=/etc/victoriametrics/tls/ca.crt",
        "-remoteWrite.tlsCAFile=",
    ]


def test_without_the_security_switch_the_local_write_is_plain_and_unused_flags_are_left_out():
    args = rw.vmagent_remote_write_args([{"name": "plain", "url": "http://p:8428/api/v1/write"}],
                                        "http://127.0.0.1:8428/", SECRETS, {})
    assert args == ["-remoteWrite.url=http://127.0.0.1:8428/api/v1/write",
                    "-remoteWrite.url=http://p:8428/api/v1/write"]


def test_site_ca_needs_the_security_switch():
    with pytest.raises(rw.AnsibleFilterError, match="site_ca needs the site CA"):
        rw.vmagent_remote_write_args([{"name": "s", "url": CLUSTER, "site_ca": True}], "http://127.0.0.1:8428",
                                     SECRETS, {})


def test_invalid_entries_stop_the_flags_too():
    with pytest.raises(rw.AnsibleFilterError, match=r"victoriametrics_remote_write is invalid: .*url is required"):
        rw.vmagent_remote_write_args([{"name": "s"}], "http://127.0.0.1:8428", SECRETS, {})
