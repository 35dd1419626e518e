"""Filters of the slurm_metrics role: what to do with slurm.conf's MailProg for the job-end GPU summary."""
from __future__ import annotations

import re

PATH = re.compile(r"^/[A-Za-z0-9._/+-]+$")
MAILPROG = re.compile(r"^\s*(?i:MailProg)\s*=\s*(\S*)")


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


class FilterModule:
    def filters(self):
        return {"hpcobs_slurm_mailprog_plan": mailprog_plan}
