"""Filters of the slurm_metrics role: whether slurmctld serves the Slurm metrics itself (and with which token), what
to do with slurm.conf's MailProg for the job-end GPU summary, and what is wrong with the settings of the collector's
front (the security switch)."""
from __future__ import annotations

import re

PATH = re.compile(r"^/[A-Za-z0-9._/+-]+$")
MAILPROG = re.compile(r"^\s*(?i:MailProg)\s*=\s*(\S*)")
SETTING = re.compile(r"^\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")
USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
# slurmctld's own metrics (metrics/openmetrics) first shipped in Slurm 25.11.
NATIVE_SINCE = (25, 11)


def _settings(conf_lines):
    """slurm.conf's settings among the lines the preflight grep returned, by lower-case name; Slurm uses the last
    one of a name. Comment lines never match (the grep anchors on the name)."""
    found = {}
    for line in conf_lines or []:
        match = SETTING.match(str(line))
        if match:
            found[match.group(1).lower()] = match.group(2).strip('"')
    return found


def _version(text):
    match = re.search(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?", str(text or ""))
    if not match:
        return "0", (0, 0, 0)
    numbers = tuple(int(part or 0) for part in match.groups())
    return match.group(0), numbers


def native_plan(conf_lines, version_output, mode, token_user="", http_jwt=True):
    """Whether slurmctld serves the Slurm metrics itself on this controller, and how VictoriaMetrics reads them.

    conf_lines: slurm.conf's lines the preflight grep returned; version_output: what `scontrol -V` printed; mode:
    slurm_metrics_native (auto, true or false); token_user: slurm_metrics_token_user ("" = the first of
    MetricsAuthUsers).

    slurmctld asks a client of /metrics/* for a Slurm JWT when slurm.conf sets MetricsAuthUsers, or PrivateData
    without MetricsParameters=ignore_private_data (Slurm 26.05 read_config.c, slurmctld/http.c). hpcobs hands
    VictoriaMetrics a token only for a user of MetricsAuthUsers, and only where slurmctld takes JWTs
    (AuthAltTypes=auth/jwt): it never mints one for root or SlurmUser, which could run any Slurm command with it.
    The GPU gauges count the gres/gpu TRES (statistics.c): with GPUs but no gres/gpu in AccountingStorageTRES they
    stay 0, so auto keeps the collector there.

    Returns {"version", "capable", "on", "token_user" (the user VictoriaMetrics' token is for, "" without),
    "blocked" (why slurmctld's metrics cannot be read, ""), "gpu_blind", "problem" (a setting that is wrong, "")}.
    """
    settings = _settings(conf_lines)
    version, numbers = _version(version_output)
    mode = str(mode).strip().lower()
    plan = {"version": version, "capable": numbers[:2] >= NATIVE_SINCE, "on": False, "token_user": "",
            "blocked": "", "gpu_blind": False, "problem": ""}
    auth_users = [name.strip() for name in settings.get("metricsauthusers", "").split(",") if name.strip()]
    private = settings.get("privatedata", "") != ""
    ignored = "ignore_private_data" in settings.get("metricsparameters", "")
    jwt = "auth/jwt" in [kind.strip() for kind in settings.get("authalttypes", "").split(",")]
    token_user = str(token_user or "").strip()
    if token_user and not USER.match(token_user):
        plan["problem"] = "slurm_metrics_token_user must be a user name (got %r)" % token_user
        return plan
    if auth_users:
        if token_user and token_user not in auth_users:
            plan["problem"] = ("slurm_metrics_token_user %s is not in slurm.conf's MetricsAuthUsers=%s: slurmctld "
                               "would refuse its token" % (token_user, ",".join(auth_users)))
            return plan
        if not jwt:
            plan["blocked"] = ("slurm.conf sets MetricsAuthUsers, so slurmctld asks for a token, but has no "
                               "AuthAltTypes=auth/jwt to take one")
        elif not http_jwt:
            plan["blocked"] = ("slurm.conf sets MetricsAuthUsers, so slurmctld asks for a token, but its HTTP "
                               "server has no http_auth/jwt plugin (http_auth_jwt.so) to take one (Debian's "
                               "slurm-wlm 26.05 packages none)")
        else:
            plan["token_user"] = token_user or auth_users[0]
    elif private and not ignored:
        plan["blocked"] = ("slurm.conf sets PrivateData, so slurmctld asks for a token of root or SlurmUser, which "
                           "hpcobs never mints: set MetricsAuthUsers=<a service account> with AuthAltTypes=auth/jwt, "
                           "or MetricsParameters=ignore_private_data")
    plan["gpu_blind"] = ("gpu" in re.split(r"[\s,]+", settings.get("grestypes", "").lower())
                         and "gres/gpu" not in settings.get("accountingstoragetres", "").lower())
    if mode == "true":
        plan["on"] = True
    elif mode == "auto":
        plan["on"] = plan["capable"] and not plan["blocked"] and not plan["gpu_blind"]
    if not plan["on"]:
        plan["token_user"] = ""
    return plan


def mailprog_plan(conf_lines, enabled, wrapper, mailer):
    """Decide MailProg from slurm.conf's lines (those the preflight grep returned).

    Returns {"set": value to write or "", "current": value slurm.conf has or "", "problem": message or ""}.
    With the summary on, MailProg becomes the wrapper, which passes each mail on to `mailer`: slurm.conf may have no
    MailProg (Slurm's default mailer), the wrapper already, or the mailer itself; any other value is a mailer the
    site set and hpcobs would lose, so it is a problem, never overwritten. With the summary off, a MailProg that is
    the wrapper is given back to the mailer; anything else is left alone.
    """
    current = ""
    for line in conf_lines or []:
        match = MAILPROG.match(str(line))
        if match:
            current = match.group(1).strip('"')  # Slurm uses the last one
    plan = {"set": "", "current": current, "problem": ""}
    for name, value in (("slurm_metrics_bin_dir/hpcobs-slurm-mail", wrapper),
                        ("slurm_metrics_job_summary_mailer", mailer)):
        if not isinstance(value, str) or not PATH.match(value):
            plan["problem"] = "%s must be an absolute path of letters, digits and ._/+- (got %r)" % (name, value)
            return plan
    if wrapper == mailer:
        plan["problem"] = "slurm_metrics_job_summary_mailer cannot be hpcobs-slurm-mail itself (%s)" % mailer
        return plan
    if enabled:
        if current in ("", mailer):
            plan["set"] = wrapper
        elif current != wrapper:
            plan["problem"] = (
                "slurm.conf sets MailProg=%s, the mailer this site chose; hpcobs would pass Slurm's mails on to %s "
                "instead. Set slurm_metrics_job_summary_mailer: %s to keep it (hpcobs-slurm-mail then hands every "
                "mail to it), or turn slurm_metrics_job_summary off" % (current, mailer, current))
    elif current == wrapper:
        plan["set"] = mailer
    return plan


LOOPBACK = re.compile(r"^(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\]):([0-9]{1,5})$")
CLIENT_USER = re.compile(r"^[A-Za-z0-9_.-]+$")


def _port(listen):
    return int(str(listen).rsplit(":", 1)[1]) if ":" in str(listen) else -1


def front_problems(security, listen, backend, internal, tls_min_version, config_dir, client_user):
    """What is wrong with the settings of the collector's front (a list of sentences, empty when nothing is). The
    front only exists under the security switch: then the collector (backend) and the front's own endpoints
    (internal) must be loopback addresses of their own, apart from the front's address, or a job could reach the
    collector around the front."""
    if not security:
        return []
    problems = []
    for name, value in (("slurm_metrics_backend_listen_address", backend),
                        ("slurm_metrics_front_internal_listen_address", internal)):
        match = LOOPBACK.match(str(value))
        if not match or not 0 < int(match.group(2)) < 65536:
            problems.append("%s must be a loopback address with a port, such as 127.0.0.1:9342 (got %r)" % (name, value))
    ports = [_port(listen), _port(backend), _port(internal)]
    if len(set(ports)) != 3:
        problems.append("slurm_metrics_listen_address, slurm_metrics_backend_listen_address and "
                        "slurm_metrics_front_internal_listen_address need three different ports (got %s)"
                        % ", ".join(str(port) for port in ports))
    if tls_min_version not in ("TLS12", "TLS13"):
        problems.append("slurm_metrics_tls_min_version must be TLS12 or TLS13 (got %r)" % (tls_min_version,))
    path = str(config_dir or "")
    if not PATH.match(path) or path.rstrip("/") in ("", "/etc", "/usr", "/var", "/tmp"):
        problems.append("slurm_metrics_config_dir must be an absolute directory of its own (got %r)" % (config_dir,))
    if not CLIENT_USER.match(str(client_user or "")):
        problems.append("slurm_metrics_client_user must be letters, digits, . _ - (got %r)" % (client_user,))
    return problems


class FilterModule:
    def filters(self):
        return {"hpcobs_slurm_mailprog_plan": mailprog_plan, "hpcobs_slurm_native_plan": native_plan,
                "hpcobs_slurm_metrics_front_problems": front_problems}
