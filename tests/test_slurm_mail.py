"""The job-end GPU summary: hpcobs-slurm-mail (Slurm's MailProg wrapper) and the role's MailProg decision.

The wrapper runs here as slurmctld runs it (`-s <subject> <recipient>` and the job in its environment), next to a
small hpcobs-jobstats written by each test, handing the mail to a recording mailer.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "roles" / "slurm_metrics" / "files" / "hpcobs-slurm-mail"
FILTERS = REPO / "roles" / "slurm_metrics" / "filter_plugins" / "hpcobs_slurm_metrics.py"
OURS = "/usr/local/bin/hpcobs-slurm-mail"

spec = importlib.util.spec_from_file_location("hpcobs_slurm_metrics_filters", FILTERS)
filters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(filters)
plan = filters.FilterModule().filters()["hpcobs_slurm_mailprog_plan"]


def executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def site(tmp_path):
    """A bin dir holding the wrapper, a recording mailer, and a config pointing the wrapper at that mailer."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(WRAPPER, bindir / "hpcobs-slurm-mail")
    record = tmp_path / "mails.jsonl"
    mailer = executable(tmp_path / "mailer", "#!%s\nimport json, sys\nwith open(%r, 'a') as f:\n"
                        "    f.write(json.dumps({'argv': sys.argv[1:], 'body': sys.stdin.read()}) + '\\n')\n"
                        % (sys.executable, str(record)))
    config = tmp_path / "jobstats.conf"
    config.write_text("url = http://127.0.0.1:9\nmailer = %s\nsummary_delay = 0\nsummary_timeout = 5\n" % mailer)

    class Site:
        path = tmp_path

        @staticmethod
        def jobstats(body):
            """hpcobs-jobstats of this test: records its arguments, then runs `body` (Python)."""
            executable(bindir / "hpcobs-jobstats", "import sys\nopen(%r, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n%s\n"
                       % (str(tmp_path / "jobstats-calls"), body))

        @staticmethod
        def run(argv, env):
            full = dict(os.environ, **env)
            return subprocess.run([sys.executable, "-c", "import importlib.machinery, sys; "
                                   "loader = importlib.machinery.SourceFileLoader('w', %r); "
                                   "w = loader.load_module(); sys.exit(w.main(sys.argv[1:], config=%r))"
                                   % (str(bindir / "hpcobs-slurm-mail"), str(config))] + argv,
                                  env=full, capture_output=True, text=True, timeout=60, check=False)

        @staticmethod
        def mails():
            return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

        @staticmethod
        def calls():
            calls = tmp_path / "jobstats-calls"
            return calls.read_text().splitlines() if calls.exists() else []

        config_file = config

    return Site


ENDED = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURM_JOB_MAIL_TYPE": "Ended"}
SUBJECT = ["-s", "Slurm Job_id=42 Name=train Ended, Run time 00:10:00, COMPLETED, ExitCode 0", "alice"]


def test_an_ended_job_gets_its_summary_in_the_mail_slurm_sends(site):
    site.jobstats("print('Job 42  user alice  account physics  partition gpu')\nprint('Verdict: All 2 GPUs were busy.')")
    done = site.run(SUBJECT, ENDED)
    assert done.returncode == 0, done.stderr
    assert site.calls() == ["42 --ended"]
    [mail] = site.mails()
    assert mail["argv"] == SUBJECT
    assert mail["body"] == ("GPU summary (hpcobs-jobstats 42):\n\nJob 42  user alice  account physics  partition gpu\n"
                            "Verdict: All 2 GPUs were busy.\n")


@pytest.mark.parametrize("mail_type", ["Began", "Requeued", "Time_limit_reached", ""])
def test_other_mails_pass_unchanged_without_asking_for_a_summary(site, mail_type):
    site.jobstats("print('never')")
    done = site.run(SUBJECT, dict(ENDED, SLURM_JOB_MAIL_TYPE=mail_type))
    assert done.returncode == 0, done.stderr
    assert site.calls() == []
    assert site.mails() == [{"argv": SUBJECT, "body": ""}]


@pytest.mark.parametrize("job_id", ["", "42;touch /tmp/x", "$(id)", "42 --url=http://evil", "-1"])
def test_only_a_numeric_job_id_reaches_hpcobs_jobstats(site, job_id):
    site.jobstats("print('never')")
    done = site.run(SUBJECT, dict(ENDED, SLURM_JOB_ID=job_id))
    assert done.returncode == 0, done.stderr
    assert site.calls() == [] and site.mails()[0]["body"] == ""


def test_arguments_reach_the_mailer_verbatim_never_through_a_shell(site, tmp_path):
    site.jobstats("print('ok')")
    hostile = ["-s", "Slurm Job_id=42 Name=$(touch %s) `id` ; rm -rf / Ended" % (tmp_path / "pwned"), "alice"]
    done = site.run(hostile, ENDED)
    assert done.returncode == 0, done.stderr
    assert site.mails()[0]["argv"] == hostile
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("body,expected", [
    ("sys.exit(2)", "No GPU summary: job 42 has no GPU metrics (it used no GPU, or ended before its first scrape).\n"),
    ("sys.stderr.write('hpcobs-jobstats: VictoriaMetrics at http://x: refused\\n'); sys.exit(1)",
     "No GPU summary: hpcobs-jobstats failed (hpcobs-jobstats: VictoriaMetrics at http://x: refused).\n"),
    ("import time; time.sleep(30)", "No GPU summary: hpcobs-jobstats took longer than 2 s.\n"),
])
def test_the_mail_is_sent_whatever_happens_to_the_summary(site, body, expected):
    site.config_file.write_text(site.config_file.read_text().replace("summary_timeout = 5", "summary_timeout = 2"))
    site.jobstats(body)
    done = site.run(SUBJECT, dict(ENDED, SLURM_JOB_MAIL_TYPE="Failed"))
    assert done.returncode == 0, done.stderr
    assert site.mails() == [{"argv": SUBJECT, "body": expected}]


def test_a_missing_mailer_is_an_error_slurmctld_logs(site):
    site.config_file.write_text("mailer = %s\nsummary_delay = 0\n" % (site.path / "no-such-mailer"))
    site.jobstats("print('x')")
    done = site.run(SUBJECT, ENDED)
    assert done.returncode == 1
    assert "cannot run the mailer %s" % (site.path / "no-such-mailer") in done.stderr


def test_the_wrapper_waits_the_configured_delay_before_the_summary(tmp_path):
    loader_spec = importlib.util.spec_from_loader("w", importlib.machinery.SourceFileLoader("w", str(WRAPPER)))
    wrapper = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(wrapper)
    config = tmp_path / "c"
    config.write_text("# comment\nmailer = /bin/true\nsummary_delay = 25\nsummary_timeout = nonsense\n")
    slept = []
    assert wrapper.main(SUBJECT, environ=dict(ENDED), config=str(config), sleep=slept.append) == 0
    assert slept == [30]  # an unreadable timeout falls back to the defaults for both
    config.write_text("mailer = /bin/true\nsummary_delay = 25\nsummary_timeout = 10\n")
    slept.clear()
    assert wrapper.main(SUBJECT, environ=dict(ENDED, SLURM_JOB_MAIL_TYPE="Began"), config=str(config),
                        sleep=slept.append) == 0
    assert slept == []
    assert wrapper.main(SUBJECT, environ=dict(ENDED), config=str(config), sleep=slept.append) == 0
    assert slept == [25]


# --- the role's decision on slurm.conf's MailProg --------------------------------------------------------------

@pytest.mark.parametrize("lines,enabled,expected_set", [
    ([], True, OURS),                                        # Slurm's default mailer: wrap it
    (["MailProg=/bin/mail"], True, OURS),                     # the mailer itself
    (["mailprog = /bin/mail"], True, OURS),                   # keys are case-insensitive
    (['MailProg="/bin/mail"'], True, OURS),
    (["MailProg=" + OURS], True, ""),                         # already ours: nothing to do
    (["MailProg=/usr/bin/site-mail", "MailProg=" + OURS], True, ""),  # the last one counts
    ([], False, ""),                                          # off and never on: nothing
    (["MailProg=/usr/bin/site-mail"], False, ""),             # off: a site's mailer is never touched
    (["MailProg=" + OURS], False, "/bin/mail"),               # turned off: MailProg goes back to the mailer
    (["GresTypes=gpu", "PrivateData=jobs"], True, OURS),      # other lines of the preflight's grep
])
def test_mailprog_plan(lines, enabled, expected_set):
    result = plan(lines, enabled, OURS, "/bin/mail")
    assert result["problem"] == "" and result["set"] == expected_set


def test_a_site_mailer_is_never_replaced_silently():
    result = plan(["MailProg=/usr/local/sbin/site-mailer"], True, OURS, "/bin/mail")
    assert result["set"] == ""
    assert "MailProg=/usr/local/sbin/site-mailer" in result["problem"]
    assert "slurm_metrics_job_summary_mailer: /usr/local/sbin/site-mailer" in result["problem"]
    # told to hand the mails to it, the wrapper takes its place
    assert plan(["MailProg=/usr/local/sbin/site-mailer"], True, OURS, "/usr/local/sbin/site-mailer")["set"] == OURS


@pytest.mark.parametrize("mailer", ["mail", "/bin/mail -t", "/bin/mail\nUser=root", "", None, OURS])
def test_a_mailer_that_is_not_a_plain_absolute_path_is_refused(mailer):
    assert plan([], True, OURS, mailer)["problem"]
