"""Tests of the Slurm prolog/epilog hooks (roles/slurm_hooks/files).

The real scripts run as subprocesses, with the environment slurmd gives them and a
config file pointing at directories under a temporary directory. Problems must be
reported through LOGGER (a small script here that records its arguments) and the
exit status must always be 0.

Some cases mount tmpfs file systems (full disk, read-only dir) or use a private
mount namespace (default paths): the suite runs as root.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "roles" / "slurm_hooks" / "files"
_spec = importlib.util.spec_from_file_location(
    "hpcobs_slurm_hooks", REPO / "roles" / "slurm_hooks" / "filter_plugins" / "hpcobs_slurm_hooks.py"
)
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
q = filters.sh_quote
PROLOG = FILES / "hpcobs-slurm-prolog"
EPILOG = FILES / "hpcobs-slurm-epilog"

SHELLS = {
    "dash": [shutil.which("dash") or "/bin/dash"],
    "bash-posix": [shutil.which("bash") or "/bin/bash", "--posix"],
}

MAPPING_NAME = re.compile(r"^\d+(\.\d+)?$")
VALID_MAPPING = re.compile(r"\A(?:[1-9][0-9]*\n)*\Z")
SEP = "\x1f"


def textfiles(directory: Path) -> list[str]:
    """The textfile dir's entries, sorted, without the hooks' staging dir, which must hold nothing."""
    names = sorted(os.listdir(directory))
    if ".staging" in names:
        assert (directory / ".staging").is_dir() and os.listdir(directory / ".staging") == []
        names.remove(".staging")
    return names


def expected_prom(job, user="alice", account="physics", partition="gpu", ngpus=0):
    return (
        "# HELP hpcobs_slurm_job_info Slurm job allocated on this node (always 1).\n"
        "# TYPE hpcobs_slurm_job_info gauge\n"
        f'hpcobs_slurm_job_info{{hpc_job="{job}",user="{user}",'
        f'account="{account}",partition="{partition}"}} 1\n'
        "# HELP hpcobs_slurm_job_gpus GPUs (or MIG instances) Slurm allocated"
        " to the job on this node.\n"
        "# TYPE hpcobs_slurm_job_gpus gauge\n"
        f'hpcobs_slurm_job_gpus{{hpc_job="{job}"}} {ngpus}\n'
    )


def parse_labels(line: str) -> dict[str, str]:
    """Strict parser of one sample line's labels (Prometheus text format)."""
    m = re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\{", line)
    assert m, line
    i = m.end()
    labels = {}
    while line[i] != "}":
        n = re.match(r"[a-zA-Z_][a-zA-Z0-9_]*=\"", line[i:])
        assert n, line[i:]
        name = n.group(0)[:-2]
        i += n.end()
        value = []
        while line[i] != '"':
            c = line[i]
            assert c != "\n"
            if c == "\\":
                nxt = line[i + 1]
                assert nxt in '\\"n', f"bad escape \\{nxt}"
                value.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                i += 2
            else:
                value.append(c)
                i += 1
        i += 1
        labels[name] = "".join(value)
        if line[i] == ",":
            i += 1
    assert line[i + 1 :] == " 1", line
    return labels


class Hooks:
    """A node's worth of hook directories under a temporary directory."""

    def __init__(self, root: Path, shell: list[str]):
        self.root = root
        self.shell = shell
        self.map = root / "mapping"
        self.tf = root / "textfile"
        self.map.mkdir()
        self.tf.mkdir()
        self.conf = root / "slurm-hooks.conf"
        self.logfile = root / "hooks.log"
        self.logger = root / "fake-logger"
        self.logger.write_text(
            "#!/bin/sh\n"
            f"IFS='{SEP}'\n"
            f"printf '%s\\n' \"$*\" >> '{self.logfile}'\n"
        )
        self.logger.chmod(0o755)
        self.configure()

    def configure(self, *lines: str, mapping_dir=None, textfile_dir=None):
        text = [
            "# written by the test, quoted as the role quotes",
            f"MAPPING_DIR={q(str(mapping_dir if mapping_dir is not None else self.map))}",
            f"TEXTFILE_DIR={q(str(textfile_dir if textfile_dir is not None else self.tf))}",
            *lines,
        ]
        self.conf.write_text("\n".join(text) + "\n")

    def env(self, job, gpus, user, account, partition, extra):
        env = {"HPCOBS_SLURM_HOOKS_CONF": str(self.conf), "LOGGER": str(self.logger)}
        if job is not None:
            env["SLURM_JOB_ID"] = str(job)
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
        for key, value in (
            ("SLURM_JOB_USER", user),
            ("SLURM_JOB_ACCOUNT", account),
            ("SLURM_JOB_PARTITION", partition),
        ):
            if value is not None:
                env[key] = value
        env.update(extra or {})
        return env

    def run(
        self,
        script,
        job=None,
        gpus=None,
        user="alice",
        account="physics",
        partition="gpu",
        env=None,
        args=(),
        quiet=True,
    ):
        """Run a hook; it must exit 0 and, unless told otherwise, print nothing
        (problems go to the logger, a shell error would show up on stderr)."""
        p = subprocess.run(
            [*self.shell, str(script), *args],
            env=self.env(job, gpus, user, account, partition, env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, (p.returncode, p.stderr)
        if quiet:
            assert p.stderr == "" and p.stdout == "", (p.stdout, p.stderr)
        return p

    def prolog(self, job, gpus=None, **kw):
        return self.run(PROLOG, job, gpus, **kw)

    def epilog(self, job, gpus=None, **kw):
        return self.run(EPILOG, job, gpus, **kw)

    def logs(self) -> list[str]:
        """Messages logged so far; checks the logger was called as documented."""
        if not self.logfile.exists():
            return []
        messages = []
        for line in self.logfile.read_text().splitlines():
            args = line.split(SEP)
            assert args[:5] == [
                "-t",
                "hpcobs-slurm-hooks",
                "-p",
                "daemon.warning",
                "--",
            ]
            assert len(args) == 6, args
            messages.append(args[5])
        return messages

    def mapping(self, directory=None) -> dict[str, str]:
        d = directory or self.map
        out = {}
        for name in os.listdir(d):
            if MAPPING_NAME.match(name):
                out[name] = (d / name).read_text()
        return out

    def prom(self, job):
        p = self.tf / f"hpcobs_slurm_job_{job}.prom"
        return p.read_text() if p.exists() else None


@pytest.fixture(params=sorted(SHELLS))
def hooks(request, tmp_path):
    return Hooks(tmp_path, SHELLS[request.param])


@pytest.fixture
def dash_hooks(tmp_path):
    return Hooks(tmp_path, SHELLS["dash"])


class Mounts:
    def __init__(self):
        self.points: list[Path] = []

    def tmpfs(self, path: Path, size="1m"):
        path.mkdir(exist_ok=True)
        subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={size},mode=0755",
                "hpcobs-test",
                str(path),
            ],
            check=True,
        )
        self.points.append(path)

    @staticmethod
    def read_only(path: Path):
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)

    @staticmethod
    def fill(path: Path):
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={path / '.filler'}", "bs=4k"],
            capture_output=True,
        )
        st = os.statvfs(path)
        assert st.f_bavail == 0

    def cleanup(self):
        for p in reversed(self.points):
            if subprocess.run(["umount", str(p)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(p)], check=True)


@pytest.fixture
def mounts():
    m = Mounts()
    yield m
    m.cleanup()


# ---------------------------------------------------------------------------
# The normal life of jobs


def test_one_job_on_two_gpus(hooks):
    hooks.prolog(1, "0,1")
    assert hooks.mapping() == {"0": "1\n", "1": "1\n"}
    assert hooks.prom(1) == expected_prom(1, ngpus=2)
    for name in ("0", "1"):
        assert stat.S_IMODE((hooks.map / name).stat().st_mode) == 0o644
    assert stat.S_IMODE((hooks.tf / "hpcobs_slurm_job_1.prom").stat().st_mode) == 0o644
    # nothing else visible to the exporters, no temp file left behind
    assert textfiles(hooks.tf) == ["hpcobs_slurm_job_1.prom"]
    assert sorted(n for n in os.listdir(hooks.map) if not n.startswith(".")) == [
        "0",
        "1",
    ]
    assert os.listdir(hooks.map / ".staging") == []
    assert hooks.logs() == []


def test_environment_seen_on_a_real_slurm_node(hooks):
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "GPU_DEVICE_ORDINAL": "0,1",
        "SLURM_JOB_UID": "0",
    }
    hooks.prolog(1, "0,1", user="root", account="physics", partition="gpu", env=env)
    assert hooks.mapping() == {"0": "1\n", "1": "1\n"}
    assert hooks.prom(1) == expected_prom(1, user="root", ngpus=2)
    hooks.epilog(1, "0,1", user="root", env=env)
    assert hooks.mapping() == {"0": "", "1": ""}
    assert hooks.prom(1) is None
    assert hooks.logs() == []


def test_two_jobs_sharing_a_gpu(hooks):
    hooks.prolog(10, "0,1")
    hooks.prolog(11, "1,2", user="bob", account="chem", partition="short")
    assert hooks.mapping() == {"0": "10\n", "1": "10\n11\n", "2": "11\n"}
    assert hooks.prom(10) == expected_prom(10, ngpus=2)
    assert hooks.prom(11) == expected_prom(11, "bob", "chem", "short", 2)
    assert hooks.logs() == []


def test_one_job_on_all_eight_gpus(hooks):
    hooks.prolog(77, "0,1,2,3,4,5,6,7")
    assert hooks.mapping() == {str(i): "77\n" for i in range(8)}
    assert hooks.prom(77) == expected_prom(77, ngpus=8)
    hooks.epilog(77, "0,1,2,3,4,5,6,7")
    assert hooks.mapping() == {str(i): "" for i in range(8)}
    assert hooks.prom(77) is None
    assert hooks.logs() == []


def test_epilog_keeps_the_other_job_on_a_shared_gpu(hooks):
    hooks.prolog(10, "0,1")
    hooks.prolog(11, "1,2")
    ino = {n: (hooks.map / n).stat().st_ino for n in ("0", "1", "2")}
    hooks.epilog(10, "0,1")
    assert hooks.mapping() == {"0": "", "1": "11\n", "2": "11\n"}
    assert hooks.prom(10) is None
    assert hooks.prom(11) == expected_prom(11, ngpus=2)
    # rewritten by rename (new inode), untouched file kept as is
    assert (hooks.map / "0").stat().st_ino != ino["0"]
    assert (hooks.map / "2").stat().st_ino == ino["2"]
    hooks.epilog(11, "1,2")
    assert hooks.mapping() == {"0": "", "1": "", "2": ""}
    assert textfiles(hooks.tf) == []
    assert hooks.logs() == []


def test_epilog_leaves_empty_files_and_removes_the_prom(hooks):
    hooks.prolog(5, "3")
    hooks.epilog(5, "3")
    f = hooks.map / "3"
    assert f.exists() and f.is_file() and f.stat().st_size == 0
    assert not (hooks.tf / "hpcobs_slurm_job_5.prom").exists()
    # a second epilog (Slurm may retry) is a no-op
    hooks.epilog(5, "3")
    assert f.exists() and f.stat().st_size == 0
    assert hooks.logs() == []


def test_prolog_twice_never_duplicates(hooks):
    hooks.prolog(3, "0,1")
    before = (hooks.map / "0").stat().st_ino
    hooks.prolog(3, "0,1")
    assert hooks.mapping() == {"0": "3\n", "1": "3\n"}
    assert (hooks.map / "0").stat().st_ino == before  # nothing to change: not rewritten


def test_epilog_removes_the_job_from_every_file(hooks):
    """Even from a GPU the epilog environment does not name (map changed meanwhile)."""
    hooks.prolog(8, "0,1")
    hooks.prolog(9, "1")
    hooks.epilog(8, "0")
    assert hooks.mapping() == {"0": "", "1": "9\n"}
    hooks.epilog(9)  # no GPU list at all in the environment
    assert hooks.mapping() == {"0": "", "1": ""}
    assert hooks.logs() == []


def test_existing_files_are_normalised(hooks):
    (hooks.map / "0").write_text("5\n5\n\nxyz\n6")
    (hooks.map / "notes").write_text("not a mapping file\n")
    hooks.prolog(7, "0")
    assert hooks.mapping() == {"0": "5\n6\n7\n"}
    assert (hooks.map / "notes").read_text() == "not a mapping file\n"
    logs = hooks.logs()
    assert len(logs) == 1 and "dropped 2 malformed line(s)" in logs[0]
    assert logs[0].startswith("prolog job 7: ")


def test_no_gpu_job_gets_job_info_only(hooks):
    hooks.prolog(4, "")
    assert hooks.mapping() == {}
    assert hooks.prom(4) == expected_prom(4, ngpus=0)
    hooks.prolog(5, None, env={"CUDA_VISIBLE_DEVICES": "NoDevFiles"})
    assert hooks.prom(5) == expected_prom(5, ngpus=0)
    assert hooks.mapping() == {}
    assert hooks.logs() == []


# ---------------------------------------------------------------------------
# GPU lists and maps


@pytest.mark.parametrize(
    "gpus,files",
    [
        ("0-3", ["0", "1", "2", "3"]),
        ("0-1,5,7", ["0", "1", "5", "7"]),
        (" 2 , 4 ", ["2", "4"]),
        ("01,0002", ["1", "2"]),
        ("3,3,2-3", ["2", "3"]),
        ("6", ["6"]),
    ],
)
def test_lenient_gpu_lists(hooks, gpus, files):
    hooks.prolog(12, gpus)
    assert hooks.mapping() == {f: "12\n" for f in files}
    assert hooks.prom(12) == expected_prom(12, ngpus=len(files))
    assert hooks.logs() == []


@pytest.mark.parametrize(
    "gpus", ["abc", "1,abc", "x-y,1", "3-1,1", "1,-2", "1,0-99999"]
)
def test_garbage_gpu_entries_are_logged_and_skipped(hooks, gpus):
    hooks.prolog(13, gpus)
    assert hooks.mapping() == ({} if gpus == "abc" else {"1": "13\n"})
    assert hooks.prom(13) is not None
    logs = hooks.logs()
    assert len(logs) == 1, logs
    assert "ignoring unusable entries in SLURM_JOB_GPUS" in logs[0]


def test_garbage_gpus_are_sanitised_in_the_log(hooks):
    hooks.prolog(13, "a\nb;$(reboot)," + "z" * 200)
    (line,) = hooks.logs()
    assert "\n" not in line and "$(" not in line
    assert len(line) < 200


def test_cuda_visible_devices_fallback(hooks):
    hooks.prolog(20, None, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    hooks.prolog(21, "", env={"CUDA_VISIBLE_DEVICES": "4"})
    # SLURM_JOB_GPUS wins when both are set
    hooks.prolog(22, "5", env={"CUDA_VISIBLE_DEVICES": "6"})
    assert hooks.mapping() == {"2": "20\n", "3": "20\n", "4": "21\n", "5": "22\n"}
    assert hooks.logs() == []


def test_cuda_visible_devices_with_uuids_is_logged(hooks):
    hooks.prolog(
        23,
        None,
        env={"CUDA_VISIBLE_DEVICES": "GPU-8d3a0e4f-1f2b-4c55-9a3e-0123456789ab"},
    )
    assert hooks.mapping() == {}
    (line,) = hooks.logs()
    assert "CUDA_VISIBLE_DEVICES" in line


def test_gpu_map(hooks):
    hooks.configure("GPU_MAP='0:2 1:3 2:0 3:1'")
    hooks.prolog(30, "0,1")
    hooks.prolog(31, "2-3")
    assert hooks.mapping() == {"2": "30\n", "3": "30\n", "0": "31\n", "1": "31\n"}
    hooks.epilog(30, "0,1")
    assert hooks.mapping() == {"2": "", "3": "", "0": "31\n", "1": "31\n"}
    assert hooks.logs() == []


def test_mig_map(hooks):
    hooks.configure("MIG_MAP='0:0.1 1:0.2 2:1.1'")
    hooks.prolog(40, "0,2")
    hooks.prolog(41, "1")
    assert hooks.mapping() == {"0.1": "40\n", "1.1": "40\n", "0.2": "41\n"}
    hooks.epilog(40, "0,2")
    assert hooks.mapping() == {"0.1": "", "1.1": "", "0.2": "41\n"}
    assert hooks.logs() == []


def test_mixed_gpu_and_mig_maps(hooks):
    hooks.configure("GPU_MAP='2:3'", "MIG_MAP='0:0.1 1:0.2'")
    hooks.prolog(42, "0-2")
    assert hooks.mapping() == {"0.1": "42\n", "0.2": "42\n", "3": "42\n"}
    assert hooks.logs() == []


def test_index_outside_the_map_is_skipped(hooks):
    hooks.configure("GPU_MAP='0:2 1:3'")
    hooks.prolog(50, "0,5,1,6")
    assert hooks.mapping() == {"2": "50\n", "3": "50\n"}
    assert hooks.prom(50) == expected_prom(50, ngpus=4)  # Slurm's allocation
    (line,) = hooks.logs()
    assert "GPU index(es) 5 6 not in GPU_MAP/MIG_MAP" in line


def test_index_outside_the_mig_map_is_skipped(hooks):
    hooks.configure("MIG_MAP='0:0.1'")
    hooks.prolog(51, "0,1")
    assert hooks.mapping() == {"0.1": "51\n"}
    (line,) = hooks.logs()
    assert "GPU index(es) 1 not in" in line


# ---------------------------------------------------------------------------
# Labels


def test_label_values_are_escaped(hooks):
    user = 'a\\b"c\nd'
    account = 'x"y'
    partition = "p\\"
    hooks.prolog(60, "0", user=user, account=account, partition=partition)
    text = hooks.prom(60)
    info = [
        line for line in text.splitlines() if line.startswith("hpcobs_slurm_job_info{")
    ]
    assert info == [
        'hpcobs_slurm_job_info{hpc_job="60",user="a\\\\b\\"c\\nd",'
        'account="x\\"y",partition="p\\\\"} 1'
    ]
    assert parse_labels(info[0]) == {
        "hpc_job": "60",
        "user": user,
        "account": account,
        "partition": partition,
    }
    assert len(text.splitlines()) == 6  # the newline did not leak into the file


def test_missing_account_and_partition_are_empty_labels(hooks):
    hooks.prolog(61, "0", account=None, partition=None)
    assert hooks.prom(61) == expected_prom(61, account="", partition="", ngpus=1)
    assert hooks.logs() == []


def test_utf8_and_spaces_pass_through(hooks):
    hooks.prolog(62, "0", user="jörg müller", account="ACME Corp")
    line = hooks.prom(62).splitlines()[2]
    assert parse_labels(line)["user"] == "jörg müller"
    assert parse_labels(line)["account"] == "ACME Corp"


# ---------------------------------------------------------------------------
# Bad input, odd environments


@pytest.mark.parametrize(
    "job",
    ["", "abc", "12a", "-1", "0", "007", "1;touch /tmp/x", "1 2", "9" * 20, "1\n2"],
)
def test_garbage_job_id_writes_nothing(hooks, job):
    hooks.prolog(job, "0,1")
    hooks.epilog(job, "0,1")
    assert os.listdir(hooks.map) == []
    assert os.listdir(hooks.tf) == []
    logs = hooks.logs()
    assert len(logs) == 2 and all("SLURM_JOB_ID" in m for m in logs)


def test_unset_job_id(hooks):
    hooks.prolog(None, "0")
    assert os.listdir(hooks.map) == []
    (line,) = hooks.logs()
    assert "SLURM_JOB_ID '' is not a job id" in line


def test_epilog_without_prolog_is_a_no_op(hooks):
    hooks.prolog(70, "0,1")
    before = {n: (hooks.map / n).stat() for n in ("0", "1")}
    hooks.epilog(71, "0,1")
    hooks.epilog(72)
    for n, st in before.items():
        now = (hooks.map / n).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert hooks.mapping() == {"0": "70\n", "1": "70\n"}
    assert textfiles(hooks.tf) == ["hpcobs_slurm_job_70.prom"]
    assert hooks.logs() == []


def test_epilog_on_an_empty_node(hooks):
    hooks.epilog(73, "0-7")
    assert os.listdir(hooks.map) == [] and os.listdir(hooks.tf) == []
    assert hooks.logs() == []


def test_missing_mapping_dir_is_logged_not_created(hooks):
    hooks.map.rmdir()
    hooks.prolog(80, "0,1")
    assert not hooks.map.exists()
    assert hooks.prom(80) == expected_prom(80, ngpus=2)  # the other half still works
    hooks.epilog(80, "0,1")
    assert hooks.prom(80) is None
    logs = hooks.logs()
    assert len(logs) == 2
    assert logs[0].startswith("prolog job 80: mapping dir ") and "missing" in logs[0]
    assert logs[1].startswith("epilog job 80: mapping dir ") and "missing" in logs[1]


def test_mapping_dir_that_is_a_file(hooks):
    hooks.map.rmdir()
    hooks.map.write_text("oops\n")
    hooks.prolog(81, "0")
    assert hooks.map.read_text() == "oops\n"
    (line,) = hooks.logs()
    assert "not a directory" in line


def test_missing_textfile_dir(hooks):
    hooks.tf.rmdir()
    hooks.prolog(82, "0")
    assert hooks.mapping() == {"0": "82\n"}
    assert not hooks.tf.exists()
    (line,) = hooks.logs()
    assert "textfile dir" in line
    hooks.epilog(82, "0")
    assert hooks.mapping() == {"0": ""}


def test_parts_can_be_disabled(hooks):
    hooks.configure(mapping_dir="", textfile_dir="")
    hooks.prolog(83, "0")
    hooks.epilog(83, "0")
    assert os.listdir(hooks.map) == [] and os.listdir(hooks.tf) == []
    assert hooks.logs() == []


def test_gpu_file_that_is_a_directory(hooks):
    (hooks.map / "3").mkdir()
    hooks.prolog(84, "2,3")
    assert (hooks.map / "3").is_dir()
    assert (hooks.map / "2").read_text() == "84\n"
    (line,) = hooks.logs()
    assert "not a readable regular file" in line


def test_staging_path_blocked(hooks):
    (hooks.map / ".staging").write_text("")
    hooks.prolog(85, "0")
    assert hooks.mapping() == {}
    assert hooks.prom(85) is not None
    (line,) = hooks.logs()
    assert "cannot create" in line


def test_read_only_mapping_and_textfile_dirs(hooks, mounts):
    mounts.tmpfs(hooks.map)
    mounts.tmpfs(hooks.tf)
    hooks.prolog(90, "0,1")
    assert hooks.mapping() == {"0": "90\n", "1": "90\n"}
    mounts.read_only(hooks.map)
    mounts.read_only(hooks.tf)
    hooks.prolog(91, "1,2")
    assert hooks.mapping() == {"0": "90\n", "1": "90\n"}
    assert hooks.prom(91) is None
    hooks.epilog(90, "0,1")
    assert hooks.mapping() == {"0": "90\n", "1": "90\n"}
    assert hooks.prom(90) is not None
    logs = hooks.logs()
    assert any(
        m.startswith("prolog job 91: mapping dir") and "not writable" in m for m in logs
    )
    assert any(
        m.startswith("prolog job 91: textfile dir") and "not writable" in m
        for m in logs
    )
    assert any(
        m.startswith("epilog job 90: mapping dir") and "not writable" in m for m in logs
    )
    assert any(m.startswith("epilog job 90: could not remove") for m in logs)
    assert len(logs) == 4, logs


def test_full_disk_keeps_previous_files(hooks, mounts):
    mounts.tmpfs(hooks.map, size="64k")
    mounts.tmpfs(hooks.tf, size="64k")
    hooks.prolog(100, "0-3")
    assert hooks.mapping() == {str(i): "100\n" for i in range(4)}
    mounts.fill(hooks.map)
    mounts.fill(hooks.tf)
    hooks.prolog(101, "0-3")
    # previous content intact, no half-written file, no temp file left
    assert hooks.mapping() == {str(i): "100\n" for i in range(4)}
    assert os.listdir(hooks.map / ".staging") == []
    assert hooks.prom(101) is None
    assert textfiles(hooks.tf) == [".filler", "hpcobs_slurm_job_100.prom"]
    logs = hooks.logs()
    assert sum("disk full" in m for m in logs) == 5, logs  # 4 GPU files + job info
    assert all(m.startswith("prolog job 101: ") for m in logs)
    # the epilog needs no data block (empty files): it still works on a full disk
    hooks.epilog(100, "0-3")
    assert hooks.mapping() == {str(i): "" for i in range(4)}
    assert hooks.prom(100) is None


@pytest.mark.parametrize("scope", ["dir", "gpu"])
def test_full_mapping_filesystem_epilog_still_removes_the_job(hooks, mounts, scope):
    """Other jobs stay listed, so the staged copy needs a data block the full filesystem does not have: the
    epilog rewrites the file in place (under the lock) instead of leaving the job behind."""
    hooks.configure(f"LOCK_SCOPE={scope}")
    mounts.tmpfs(hooks.map, size="64k")
    hooks.prolog(200, "0-3")
    hooks.prolog(201, "0-3")
    mounts.fill(hooks.map)
    hooks.epilog(200, "0-3")
    assert hooks.mapping() == {str(i): "201\n" for i in range(4)}
    assert os.listdir(hooks.map / ".staging") == []
    logs = hooks.logs()
    assert sorted(logs) == [
        f"epilog job 200: cannot write {hooks.map}/.staging/{n} (disk full?); {hooks.map}/{n} rewritten in place"
        for n in range(4)
    ], logs
    assert hooks.prom(200) is None
    hooks.epilog(201, "0-3")  # emptied files need no block: staged and renamed as usual
    assert hooks.mapping() == {str(i): "" for i in range(4)}
    assert len(hooks.logs()) == 4


def test_logger_failure_falls_back_to_stderr(hooks):
    p = hooks.prolog(
        "x", "0", env={"LOGGER": str(hooks.root / "no-such-logger")}, quiet=False
    )
    assert "SLURM_JOB_ID 'x' is not a job id" in p.stderr


# ---------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(
    "line,what",
    [
        ("LOCK_SCOPE=node", "LOCK_SCOPE must be dir or gpu"),
        ("LOCK_TIMEOUT=0", "LOCK_TIMEOUT"),
        ("LOCK_TIMEOUT=ten", "LOCK_TIMEOUT"),
        ("hpcobs-no-such-command", "not a working sh fragment (status 127)"),
        ("GPU_MAP='0:1", "not a working sh fragment (status 2)"),
        ("TEXTFILE_DIR=relative/dir", "TEXTFILE_DIR must be an absolute path"),
    ],
)
def test_config_error_prolog_does_nothing_epilog_still_removes_the_job(hooks, line, what):
    """A job started with a good config; the config then breaks: the next prolog does nothing, the epilog of
    the running job removes it all the same (the built-in default for each unusable value)."""
    hooks.prolog(109, "0,1")
    hooks.configure(line)
    if line.startswith("TEXTFILE_DIR="):
        # its default (/var/lib/node_exporter/textfile) is not this test's: the mapping part is what is checked
        (hooks.tf / "hpcobs_slurm_job_109.prom").unlink()
    hooks.prolog(110, "0,1")
    hooks.epilog(109, "0,1")
    assert hooks.mapping() == {"0": "", "1": ""}
    assert textfiles(hooks.tf) == []
    logs = hooks.logs()
    assert len(logs) == 2, logs
    assert logs[0].startswith("prolog job 110: config ") and logs[0].endswith("; nothing done")
    assert logs[1].startswith("epilog job 109: config ")
    assert logs[1].endswith("; removing the job all the same")
    assert all(what in m for m in logs), logs


def test_relative_mapping_dir_makes_the_prolog_do_nothing(hooks):
    hooks.configure(mapping_dir="relative/dir")
    hooks.prolog(111, "0,1")
    assert os.listdir(hooks.map) == [] and os.listdir(hooks.tf) == []
    (line,) = hooks.logs()
    assert "MAPPING_DIR must be an absolute path; nothing done" in line


def test_a_directory_inside_a_staging_directory_makes_the_prolog_do_nothing(hooks):
    """Staged files are renamed by replacing the first "/.staging/" of their path: no directory lies in one."""
    (hooks.map / ".staging").mkdir()
    hooks.configure(mapping_dir=str(hooks.map / ".staging" / "x"))
    hooks.prolog(117, "0")
    assert os.listdir(hooks.map / ".staging") == [] and os.listdir(hooks.tf) == []
    (line,) = hooks.logs()
    assert "MAPPING_DIR must not be in a .staging directory; nothing done" in line


def test_log_tag_with_a_space_is_no_error(hooks):
    """LOG_TAG="a b" once left every job behind; quoted, it is just a tag."""
    hooks.configure(f"LOG_TAG={q('a b')}")
    hooks.prolog(112, "0")
    hooks.epilog(112, "0")
    assert hooks.mapping() == {"0": ""} and textfiles(hooks.tf) == []
    assert not hooks.logfile.exists()
    hooks.prolog("bad", "0")
    (line,) = hooks.logfile.read_text().splitlines()
    assert line.split(SEP)[:2] == ["-t", "a b"]


def test_quoted_values_are_data_never_code(hooks, tmp_path):
    tag = "it's $(touch %s/m1) `touch %s/m2` \"q\" \\ ${HOME} *" % (tmp_path, tmp_path)
    hooks.configure(f"LOG_TAG={q(tag)}", f"GPU_MAP={q('0:1 1:$(touch ' + str(tmp_path) + '/m3)')}")
    hooks.prolog(113, "0,1")
    assert hooks.mapping() == {"1": "113\n"}
    hooks.prolog("bad", "0")
    lines = hooks.logfile.read_text().splitlines()
    assert [line.split(SEP)[1] for line in lines] == [tag, tag]
    assert "GPU index(es) 1 not in GPU_MAP/MIG_MAP" in lines[0]
    assert not any((tmp_path / m).exists() for m in ("m1", "m2", "m3"))


def test_the_config_does_not_change_the_commands_the_hook_runs(hooks, tmp_path):
    """The fragment is sourced; a PATH in it does not reach the commands the hook runs (flock, rename, rm)."""
    for name in ("flock", "rename.ul", "rename", "rm"):
        (tmp_path / name).write_text(f"#!/bin/sh\ntouch {tmp_path}/ran-{name}\n")
        (tmp_path / name).chmod(0o755)
    hooks.configure(f"PATH={q(str(tmp_path))}")
    hooks.prolog(114, "0")
    assert hooks.mapping() == {"0": "114\n"} and hooks.prom(114) is not None
    hooks.epilog(114, "0")
    assert hooks.mapping() == {"0": ""} and hooks.prom(114) is None
    assert not any(p.name.startswith("ran-") for p in tmp_path.iterdir())
    assert hooks.logs() == []


def test_a_map_never_names_a_file_outside_the_mapping_dir(hooks):
    hooks.configure(f"GPU_MAP={q('0:../escape 1:2 2:.hidden 3:1.2.3 4:x/y')}")
    hooks.prolog(115, "0-4")
    assert hooks.mapping() == {"2": "115\n"}
    assert sorted(os.listdir(hooks.map)) == [".hpcobs.lock", ".staging", "2"]
    assert (hooks.map / ".hpcobs.lock").read_text().strip().isdigit()  # the last holder's pid
    assert sorted(os.listdir(hooks.root)) == sorted(
        ["mapping", "textfile", "slurm-hooks.conf", "fake-logger", "hooks.log"]
    )
    (line,) = hooks.logs()
    assert "GPU index(es) 0 2 3 4 not in GPU_MAP/MIG_MAP" in line


@pytest.mark.parametrize("how", ["not root's", "symlink"])
def test_an_untrusted_config_is_never_read(hooks, tmp_path, how):
    """Only root's own config file is sourced (its mode is the role's: 0644 in a root-owned 0755 directory)."""
    hooks.configure(f"LOG_TAG={q('from-the-config')}", f"touch {tmp_path}/ran")
    if how == "not root's":
        os.chown(hooks.conf, 65534, 0)
    else:
        real = tmp_path / "real.conf"
        hooks.conf.rename(real)
        hooks.conf.symlink_to(real)
    hooks.prolog(116, "0")
    assert os.listdir(hooks.map) == [] and os.listdir(hooks.tf) == []
    assert not (tmp_path / "ran").exists()
    (line,) = hooks.logs()  # the built-in tag: the config was not read
    if how == "symlink":
        assert "not a readable file; nothing done" in line
    else:
        assert "not owned by root; not read; nothing done" in line


def test_unreadable_config(hooks):
    hooks.conf.unlink()
    hooks.conf.mkdir()
    hooks.prolog(111, "0")
    assert os.listdir(hooks.map) == []
    (line,) = hooks.logs()
    assert "not a readable file" in line


def test_the_config_the_role_writes(hooks):
    settings = {
        "slurm_conf_dir": "/etc/slurm", "slurm_conf": "/etc/slurm/slurm.conf", "prolog_dir": "/etc/slurm/prolog.d",
        "epilog_dir": "/etc/slurm/epilog.d", "bin_dir": "/usr/local/sbin", "prolog_flags": ["Alloc"],
        "slurm_bin_dirs": [], "mapping_dir": str(hooks.map), "textfile_dir": str(hooks.tf),
        "gpu_map": {1: 0, 0: 1}, "mig_map": {2: "3.1"}, "lock_scope": "gpu", "lock_timeout": 5,
        "log_tag": "hpcobs-slurm-hooks", "logger": str(hooks.logger),
    }
    hooks.conf.write_text("# hpcobs slurm hooks\n\n" + filters.slurm_hooks_conf(settings))
    hooks.prolog(112, "0,2")
    assert hooks.mapping() == {"1": "112\n", "3.1": "112\n"}
    assert hooks.prom(112) is not None
    hooks.epilog(112)
    assert hooks.mapping() == {"1": "", "3.1": ""}
    assert hooks.logs() == []


def test_log_tag_from_config(hooks):
    hooks.configure("LOG_TAG=gpu-hooks")
    hooks.prolog("bad", "0")
    (line,) = hooks.logfile.read_text().splitlines()
    assert line.split(SEP)[:2] == ["-t", "gpu-hooks"]


def test_missing_config_means_defaults(hooks, tmp_path):
    """Default paths, checked in a private mount namespace over tmpfs /run and /var/lib."""
    script = f"""
        PATH=/usr/sbin:/usr/bin:/sbin:/bin
        mount -t tmpfs hpcobs-test /run && mount -t tmpfs hpcobs-test /var/lib || exit 99
        mkdir -p /run/hpcobs/dcgm-job-mapping /var/lib/node_exporter/textfile
        "$@" {PROLOG} || exit 98
        for f in /run/hpcobs/dcgm-job-mapping/* /var/lib/node_exporter/textfile/*; do
            printf '==%s\\n' "$f"; cat "$f"
        done
        "$@" {EPILOG} || exit 97
        ls -A /run/hpcobs/dcgm-job-mapping /var/lib/node_exporter/textfile
    """
    env = hooks.env(120, "0,1", "alice", "physics", "gpu", {})
    env["HPCOBS_SLURM_HOOKS_CONF"] = str(tmp_path / "absent.conf")
    p = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            script,
            "sh",
            *hooks.shell,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert (
        "==/run/hpcobs/dcgm-job-mapping/0\n120\n==/run/hpcobs/dcgm-job-mapping/1\n120\n"
        in out
    )
    assert (
        "==/var/lib/node_exporter/textfile/hpcobs_slurm_job_120.prom\n"
        + expected_prom(120, ngpus=2)
    ) in out
    after = out.split(expected_prom(120, ngpus=2))[1]
    assert "hpcobs_slurm_job_120.prom" not in after
    assert hooks.logs() == []


def test_untrusted_config_epilog_removes_the_job_from_the_default_dirs(hooks, tmp_path):
    """The prolog ran with the defaults; the config then is not root's: the epilog does not read it, and
    removes the job from the default directories all the same (private mount namespace, tmpfs /run, /var/lib)."""
    conf = tmp_path / "slurm-hooks.conf"
    script = f"""
        PATH=/usr/sbin:/usr/bin:/sbin:/bin
        mount -t tmpfs hpcobs-test /run && mount -t tmpfs hpcobs-test /var/lib || exit 99
        mkdir -p /run/hpcobs/dcgm-job-mapping /var/lib/node_exporter/textfile
        rm -f {conf}
        "$@" {PROLOG} || exit 98
        cat /run/hpcobs/dcgm-job-mapping/0 || exit 97
        printf "LOG_TAG='x'\\n" > {conf} && chown 65534 {conf}
        "$@" {EPILOG} || exit 96
        printf '==\\n'; cat /run/hpcobs/dcgm-job-mapping/0
        ls -A /var/lib/node_exporter/textfile/.staging; ls /var/lib/node_exporter/textfile
    """
    env = hooks.env(121, "0", "alice", "physics", "gpu", {})
    p = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", *hooks.shell],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert (p.returncode, p.stderr) == (0, "")
    assert p.stdout == "121\n==\n"
    (line,) = hooks.logs()
    assert line.startswith("epilog job 121: config ") and line.endswith(
        "not owned by root; not read; removing the job all the same"
    )


# ---------------------------------------------------------------------------
# How the script is started


def test_started_like_slurmd_does(dash_hooks, tmp_path):
    """Executed directly (shebang), no PATH, mode from SLURM_SCRIPT_CONTEXT."""
    h = dash_hooks
    renamed = tmp_path / "50-hpcobs"
    shutil.copy(PROLOG, renamed)
    env = h.env(
        130, "0", "alice", "physics", "gpu", {"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    )
    assert "PATH" not in env
    assert subprocess.run([str(renamed)], env=env, timeout=60).returncode == 0
    assert h.mapping() == {"0": "130\n"}
    env["SLURM_SCRIPT_CONTEXT"] = "epilog_slurmd"
    assert subprocess.run([str(renamed)], env=env, timeout=60).returncode == 0
    assert h.mapping() == {"0": ""}
    assert h.prom(130) is None
    # the committed epilog entry point runs as well
    env.pop("SLURM_SCRIPT_CONTEXT")
    assert subprocess.run([str(PROLOG)], env=env, timeout=60).returncode == 0
    assert h.mapping() == {"0": "130\n"}
    assert subprocess.run([str(EPILOG)], env=env, timeout=60).returncode == 0
    assert h.mapping() == {"0": ""}
    assert h.logs() == []


def test_mode_from_argument(hooks):
    hooks.run(EPILOG, 131, "0", args=("prolog",))
    assert hooks.mapping() == {"0": "131\n"}
    hooks.run(PROLOG, 131, "0", args=("epilog",))
    assert hooks.mapping() == {"0": ""}


def test_unknown_mode_does_nothing(hooks, tmp_path):
    renamed = tmp_path / "50-hpcobs"
    shutil.copy(PROLOG, renamed)
    hooks.run(renamed, 132, "0")
    hooks.run(PROLOG, 132, "0", env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"})
    assert os.listdir(hooks.map) == [] and os.listdir(hooks.tf) == []
    logs = hooks.logs()
    assert len(logs) == 2
    assert "cannot tell prolog from epilog" in logs[0]
    assert "not meant to run as prolog_slurmctld" in logs[1]


def hold(lock: Path) -> subprocess.Popen:
    """A process holding LOCK (as a stuck hook would) until killed."""
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"])
    deadline = time.monotonic() + 10
    while subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return holder


def test_stuck_lock_holder_does_not_block_the_job(hooks):
    hooks.configure("LOCK_TIMEOUT=1")
    lock = hooks.map / ".hpcobs.lock"
    holder = hold(lock)
    try:
        t0 = time.monotonic()
        hooks.prolog(140, "0")
        assert time.monotonic() - t0 < 5
        hooks.prolog(141, "0")  # the new lock file: no wait, nothing to report
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait()
    assert hooks.mapping() == {"0": "140\n141\n"}
    (line,) = hooks.logs()
    assert line.startswith("prolog job 140: no lock on ") and "replaced the lock file (its holder is stuck)" in line


@pytest.mark.parametrize("scope", ["dir", "gpu"])
def test_a_stuck_lock_loses_no_epilog_update(dash_hooks, scope):
    """20 jobs' epilogs at once while a stuck process holds the lock: every id goes (the lock file is replaced
    once, and the epilogs then take turns on the new one)."""
    hooks = dash_hooks
    hooks.configure(f"LOCK_SCOPE={scope}", "LOCK_TIMEOUT=3")
    jobs = list(range(300, 320))
    for job in jobs:
        hooks.prolog(job, "0,1")
    assert hooks.mapping() == {"0": "".join(f"{j}\n" for j in jobs), "1": "".join(f"{j}\n" for j in jobs)}
    lock = hooks.map / (".hpcobs.lock" if scope == "dir" else ".hpcobs.lock.0")
    holder = hold(lock)
    try:
        procs = [
            subprocess.Popen([*hooks.shell, str(EPILOG)], env=hooks.env(j, "0,1", "alice", "physics", "gpu", {}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for j in jobs
        ]
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert (p.returncode, out, err) == (0, b"", b"")
    finally:
        holder.kill()
        holder.wait()
    assert hooks.mapping() == {"0": "", "1": ""}
    assert textfiles(hooks.tf) == []
    logs = hooks.logs()
    # once, unless the machine is so busy that the queue on the new lock stands still for LOCK_TIMEOUT
    replaced = [m for m in logs if "replaced the lock file" in m]
    assert len(replaced) >= 1, logs
    assert all("no lock on" in m for m in logs) and not any("without it" in m for m in logs), logs


def test_a_lock_that_stays_stuck_is_done_without(hooks):
    """If even the replacement cannot be had (here: the replacement lock is held too), the hook goes on."""
    hooks.configure("LOCK_TIMEOUT=1")
    hooks.prolog(142, "0")
    holders = [hold(hooks.map / ".hpcobs.lock"), hold(hooks.map / ".hpcobs.replace.lock")]
    try:
        hooks.epilog(142, "0")
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert hooks.mapping() == {"0": ""}
    (line,) = hooks.logs()
    assert "no lock on" in line and "even after replacing it; continuing without it" in line


# ---------------------------------------------------------------------------
# Concurrency


class Reader(threading.Thread):
    """Reads the mapping dir the way dcgm-exporter does (list, then open each
    numeric name), as fast as it can, and records anything an exporter would choke
    on or that shows a partial or lost update.

    The main thread publishes `phase` = (old_jobs, new_jobs) before starting a
    round in which the old jobs' epilogs and the new jobs' prologs run at once.
    Within a round, a file may only lose old ids (for good) and gain new ids (for
    good); any other id, an id coming back, or one vanishing again is an error.
    """

    def __init__(self, directory: Path):
        super().__init__(daemon=True)
        self.dir = directory
        self.stop = threading.Event()
        self.phase: tuple[list[int], list[int]] = ([], [])
        self.errors: list[str] = []
        self.reads = 0
        self.seen: set[str] = set()

    def run(self):
        state_of = None
        while not self.stop.is_set():
            phase = self.phase
            if phase is not state_of:
                state_of = phase
                old, new = phase
                allowed = {str(g): (set(), set()) for g in range(8)}
                for j in old:
                    for g in gpus_of(j):
                        allowed[str(g)][0].add(j)
                for j in new:
                    for g in gpus_of(j):
                        allowed[str(g)][1].add(j)
                vanished = {n: set() for n in allowed}
                appeared = {n: set() for n in allowed}
            for name in os.listdir(self.dir):
                if not MAPPING_NAME.match(name):
                    continue
                try:
                    text = (self.dir / name).read_text()
                except FileNotFoundError:
                    self.errors.append(f"{name} vanished after being listed")
                    continue
                if self.phase is not phase:
                    break  # read straddles two rounds: not judged
                self.reads += 1
                self.seen.add(name)
                self.check(name, text, allowed, vanished, appeared)
            if len(self.errors) > 20:
                return
            time.sleep(0.0002)  # leave the hooks some CPU on a small machine

    def check(self, name, text, allowed, vanished, appeared):
        if not VALID_MAPPING.match(text):
            self.errors.append(f"{name}: malformed {text!r}")
            return
        ids = [int(i) for i in text.split()]
        if len(ids) != len(set(ids)):
            self.errors.append(f"{name}: duplicate in {text!r}")
        old, new = allowed.get(name, (set(), set()))
        present = set(ids)
        if present - old - new:
            self.errors.append(f"{name}: unexpected ids {sorted(present - old - new)}")
        for j in old:
            if j not in present:
                vanished[name].add(j)
            elif j in vanished[name]:
                self.errors.append(f"{name}: id {j} came back")
        for j in new:
            if j in present:
                appeared[name].add(j)
            elif j in appeared[name]:
                self.errors.append(f"{name}: id {j} disappeared")


def gpus_of(job: int) -> list[int]:
    """Heavily overlapping allocations: every job on GPU 0, most on several more."""
    return sorted({0, job % 8, (job * 3) % 8, (job + 5) % 8})


@pytest.mark.parametrize(
    "shell,scope", [("dash", "dir"), ("dash", "gpu"), ("bash-posix", "dir")]
)
def test_concurrent_prologs_and_epilogs(tmp_path, shell, scope):
    hooks = Hooks(tmp_path, SHELLS[shell])
    hooks.configure(f"LOCK_SCOPE={scope}")
    jobs_per_round, rounds = 50, 3
    reader = Reader(hooks.map)
    reader.start()

    def start(script, job):
        env = hooks.env(
            job, ",".join(map(str, gpus_of(job))), "alice", "physics", "gpu", {}
        )
        return subprocess.Popen(
            [*hooks.shell, str(script)], env=env, stderr=subprocess.PIPE
        )

    def expect(jobs):
        want = {str(g): [] for g in range(8)}
        for j in jobs:
            for g in gpus_of(j):
                want[str(g)].append(j)
        got = hooks.mapping()
        assert set(got) == set(want)
        for name, ids in want.items():
            lines = got[name].split("\n")
            assert lines[-1] == ""
            assert sorted(map(int, lines[:-1])) == sorted(ids), name

    previous: list[int] = []
    try:
        for r in range(rounds + 1):
            current = (
                []
                if r == rounds
                else [1000 * (r + 1) + i for i in range(jobs_per_round)]
            )
            reader.phase = (previous, current)
            procs = []
            # interleave the next round's prologs with the last round's epilogs
            for i in range(max(len(current), len(previous))):
                if i < len(current):
                    procs.append(start(PROLOG, current[i]))
                if i < len(previous):
                    procs.append(start(EPILOG, previous[i]))
            for p in procs:
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0 and err == b"", err
            expect(current)
            previous = current
    finally:
        reader.stop.set()
        reader.join(timeout=30)
    assert reader.errors == []
    assert reader.reads > 0 and reader.seen == {str(g) for g in range(8)}
    assert os.listdir(hooks.map / ".staging") == []
    assert textfiles(hooks.tf) == []
    assert hooks.logs() == []
