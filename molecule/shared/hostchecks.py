"""Checks the scenarios' testinfra modules make of any systemd service (pytest.ini puts this directory on the path)."""


def unit_property(host, unit, name):
    return host.check_output("systemctl show -p %s --value %s" % (name, unit)).strip()


def main_pid(host, unit):
    pid = unit_property(host, unit, "MainPID")
    assert pid not in ("", "0"), "%s has no main process" % unit
    return pid


def cmdline(host, unit):
    """The argv of the unit's main process."""
    return host.file("/proc/%s/cmdline" % main_pid(host, unit)).content_string.split("\0")


def assert_runs_as_its_own_user(host, unit, user):
    """The unit is enabled and running, as `user`: an existing account without a login shell. Returns the account."""
    service = host.service(unit)
    assert service.is_enabled, "%s is not enabled" % unit
    assert service.is_running, "%s is not running" % unit
    account = host.user(user)
    assert account.exists and account.shell.endswith("nologin"), "%s is not a no-login account" % user
    assert host.check_output("ps -o user= -p %s" % main_pid(host, unit)).strip() == user
    return account
