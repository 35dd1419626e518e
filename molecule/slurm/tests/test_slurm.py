"""Verify real Slurm jobs on the lab clusters of Debian 12 (Slurm 22.05) and Debian 13 (Slurm 24.11).

Each cluster: <c>-ctl (slurmctld), <c>-gpu1 and <c>-gpu2 (slurmd, 4 fake GPUs each, node_exporter, the GPU simulator
served by the dcgm_exporter role, the slurm_hooks prolog/epilog). Jobs are submitted as the lab users with their
accounts and held running (a `sleep` to cancel, or a loop waiting for a release file on the node) so that every state
is checked while it lasts; both clusters run the same steps side by side.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import site_tls
import testinfra
from polling import wait_for

CLUSTERS = {"d12": "22.05.", "d13": "24.11."}
MAPPING = "/run/hpcobs/dcgm-job-mapping"
TEXTFILE = "/var/lib/node_exporter/textfile"
HOOKS_CONF = "/etc/hpcobs/slurm-hooks.conf"
ROLE = Path(__file__).resolve().parents[3] / "roles" / "slurm_hooks"
TIMEOUT = 90


def podman(name):
    return testinfra.get_host("podman://%s" % name)


class Cluster:
    def __init__(self, name):
        self.name = name
        self.ctl = podman("slurm-%s-ctl" % name)
        self.gpu1 = podman("slurm-%s-gpu1" % name)
        self.gpu2 = podman("slurm-%s-gpu2" % name)
        self.node_names = {"slurm-%s-gpu1" % name: self.gpu1, "slurm-%s-gpu2" % name: self.gpu2}

    def __repr__(self):
        return "Cluster(%s)" % self.name


@pytest.fixture(scope="module")
def clusters():
    return [Cluster(name) for name in CLUSTERS]


def wait_until(what, probe, timeout=TIMEOUT):
    return wait_for(what, probe, timeout, interval=0.5)


def submit(cluster, user, account, gpus, node, release=None):
    """Submit a batch job; it runs until cancelled, or until <release> exists on the node."""
    if release:
        script = "while [ ! -e %s ]; do sleep 0.2; done" % release
    else:
        script = "sleep 600"
    out = cluster.ctl.check_output(
        "runuser -u %s -- sbatch --parsable --job-name=hpcobs-verify --account=%s --gres=%s --nodelist=%s "
        "--ntasks=1 --cpus-per-task=1 --chdir=/tmp --output=/dev/null --wrap=%s", user, account, "gpu:%d" % gpus,
        node, script)
    return out.strip().split(";")[0]


def job_state(cluster, job):
    return cluster.ctl.run("squeue --noheader --jobs=%s --format=%%T", job).stdout.strip()


def wait_running(cluster, job):
    wait_until("job %s running on %s" % (job, cluster.name), lambda: job_state(cluster, job) == "RUNNING")


def wait_gone(cluster, job):
    # squeue lists a job until its epilog finished on every node (COMPLETING), so the hooks are done after this
    wait_until("job %s gone on %s" % (job, cluster.name), lambda: job_state(cluster, job) == "")


def gpu_indices(cluster, job):
    """Slurm's GPU indices of a job, from `scontrol show job -d` (e.g. GRES=gpu:3(IDX:0-1,3))."""
    detail = cluster.ctl.check_output("scontrol show job -d %s", job)
    match = re.search(r"GRES=\S*\(IDX:([0-9,-]+)\)", detail)
    assert match, detail
    indices = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices


def mapping_files(node):
    """{file name: content} of the dcgm job mapping directory (the hooks' dot files left out)."""
    out = node.check_output("cd %s && for f in *; do [ -f \"$f\" ] && printf '%%s\\t%%s\\n' \"$f\" \"$(cat \"$f\" | tr '\\n' ,)\"; done; true", MAPPING)
    files = {}
    for line in out.splitlines():
        name, _, content = line.partition("\t")
        files[name] = content
    return files


def prom_files(node):
    out = node.check_output("ls -A %s", TEXTFILE)
    return sorted(name for name in out.split() if "hpcobs_slurm_job" in name)


def expected_prom(job, user, account, gpus):
    return ("# HELP hpcobs_slurm_job_info Slurm job allocated on this node (always 1).\n"
            "# TYPE hpcobs_slurm_job_info gauge\n"
            'hpcobs_slurm_job_info{hpc_job="%s",user="%s",account="%s",partition="gpu"} 1\n'
            "# HELP hpcobs_slurm_job_gpus GPUs (or MIG instances) Slurm allocated to the job on this node.\n"
            "# TYPE hpcobs_slurm_job_gpus gauge\n"
            'hpcobs_slurm_job_gpus{hpc_job="%s"} %d\n' % (job, user, account, job, gpus))


# The exporters serve HTTPS with basic auth (the site's security switch, on by default): a scrape trusts the site CA
# the role installed and presents the exporter's client credential from the scenario's PKI, as VictoriaMetrics does.
EXPORTERS = {9100: ("node_exporter", "/etc/node_exporter/tls/ca.crt"),
             9400: ("dcgm_exporter", "/etc/dcgm-exporter/tls/ca.crt")}
_SCRAPE = ("import os,ssl,sys,urllib.request\n"
           "url,ca=sys.argv[1:3]\n"
           "req=urllib.request.Request(url,headers={'Authorization':os.environ['HPCOBS_TEST_AUTH']})\n"
           "ctx=ssl.create_default_context(cafile=ca)\n"
           "sys.stdout.write(urllib.request.urlopen(req,timeout=10,context=ctx).read().decode())\n")


def scrape(node, port):
    component, ca = EXPORTERS[port]
    auth = site_tls.basic("hpcobs", site_tls.credential(component.replace("_", "-") + "-client"))
    return node.check_output("HPCOBS_TEST_AUTH=%s python3 -c %s https://127.0.0.1:%d/metrics %s" % (
        shlex.quote(auth), shlex.quote(_SCRAPE), port, ca))


def dcgm_jobs_by_gpu(node):
    """{gpu: set of hpc_job} from the DCGM_FI_DEV_GPU_TEMP series of the exporter (the GPU simulator)."""
    jobs = {}
    for line in scrape(node, 9400).splitlines():
        if not line.startswith("DCGM_FI_DEV_GPU_TEMP{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        jobs.setdefault(labels["gpu"], set())
        if "hpc_job" in labels:
            jobs[labels["gpu"]].add(labels["hpc_job"])
    return jobs


def hook_log(node, since):
    return node.check_output("journalctl --quiet --no-pager -o cat -t hpcobs-slurm-hooks --since=%s",
                             "@%d" % since).strip()


def node_states(cluster):
    out = cluster.ctl.check_output("sinfo --noheader --Node --format='%N %t'")
    return dict(line.split() for line in out.splitlines())


def assert_no_node_drained(cluster):
    states = node_states(cluster)
    assert set(states) == set(cluster.node_names), states
    for node, state in states.items():
        assert state in ("idle", "mix", "alloc"), "%s is %s on %s" % (node, state, cluster.name)
    assert cluster.ctl.check_output("sinfo --noheader --states=drain,draining,drained,down,fail --format=%N") == ""


def assert_clean(cluster, node):
    """No job left anywhere on the node: every mapping file empty, no job-info file, no hpc_job series."""
    host = cluster.node_names[node]
    files = mapping_files(host)
    assert all(content == "" for content in files.values()), files
    assert prom_files(host) == []
    assert "hpcobs_slurm_job_info{" not in scrape(host, 9100)
    assert all(not jobs for jobs in dcgm_jobs_by_gpu(host).values())


# --- The clusters as converged ----------------------------------------------------------------------------------

def test_slurm_versions_of_debian(clusters):
    for cluster in clusters:
        for host in [cluster.ctl, cluster.gpu1, cluster.gpu2]:
            assert host.check_output("sinfo --version").startswith("slurm " + CLUSTERS[cluster.name]) or \
                host.check_output("sinfo --version").startswith("slurm-wlm " + CLUSTERS[cluster.name])
        assert cluster.ctl.check_output("scontrol ping").endswith("is UP")


@pytest.mark.parametrize("unit,where", [
    ("munge", "all"), ("slurmctld", "ctl"), ("slurmd", "nodes"), ("hpcobs-lab-gpus", "nodes"),
    ("node_exporter", "nodes"), ("dcgm_exporter", "nodes"),
])
def test_services(clusters, unit, where):
    for cluster in clusters:
        hosts = {"all": [cluster.ctl, cluster.gpu1, cluster.gpu2], "ctl": [cluster.ctl],
                 "nodes": [cluster.gpu1, cluster.gpu2]}[where]
        for host in hosts:
            service = host.service(unit)
            assert service.is_enabled and service.is_running, "%s on %s" % (unit, host.backend.name)


def test_one_munge_key_per_cluster(clusters):
    sums = {}
    for cluster in clusters:
        keys = {host.check_output("sha256sum /etc/munge/munge.key").split()[0]
                for host in [cluster.ctl, cluster.gpu1, cluster.gpu2]}
        assert len(keys) == 1, cluster
        sums[cluster.name] = keys.pop()
        key = cluster.gpu1.file("/etc/munge/munge.key")
        assert (key.user, key.group, key.mode) == ("munge", "munge", 0o400)
    assert sums["d12"] != sums["d13"]


def test_fake_gpus(clusters):
    for cluster in clusters:
        for host in [cluster.gpu1, cluster.gpu2]:
            for index in range(4):
                out = host.check_output("stat -c '%%F %%t %%T' %s", "/dev/nvidia%d" % index)
                assert out == "character special file c3 %x" % index
            assert not host.file("/dev/nvidia4").exists
            assert not host.file("/dev/nvidiactl").exists


def test_nodes_idle_with_their_gpus_and_hardware(clusters):
    for cluster in clusters:
        out = cluster.ctl.check_output("sinfo --noheader --Node --format='%N %t %G %c %X %Y %Z'")
        rows = sorted(line.split() for line in out.splitlines())
        assert [row[0] for row in rows] == sorted(cluster.node_names)
        for name, state, gres, cpus, sockets, cores, threads in rows:
            assert state == "idle" and gres.startswith("gpu:4"), rows
            hw = dict(re.findall(r"(\w+)=(\S+)", cluster.node_names[name].check_output("slurmd -C").splitlines()[0]))
            assert (cpus, sockets, cores, threads) == (hw["CPUs"], hw["SocketsPerBoard"], hw["CoresPerSocket"],
                                                       hw["ThreadsPerCore"])


def test_slurm_conf_has_the_hooks_and_the_merged_flags(clusters):
    for cluster in clusters:
        conf = cluster.ctl.file("/etc/slurm/slurm.conf").content_string
        assert conf.startswith("# hpcobs-lab: written by the lab_slurm role")
        settings = [line for line in conf.splitlines() if re.match(r"(?i)(Prolog|Epilog|PrologFlags)=", line)]
        assert settings == ["PrologFlags=Alloc,DeferBatch", "Prolog=/etc/slurm/prolog.d/*", "Epilog=/etc/slurm/epilog.d/*"]
        assert conf.count("# hpcobs slurm_hooks role:") == 1
        # the block sits before the node definitions
        assert conf.index("Prolog=/etc/slurm/prolog.d/*") < conf.index("NodeName=")
        running = cluster.ctl.check_output("scontrol show config")
        # 22.05 prints "Prolog = <value>", 24.11 "Prolog[0] = <value>" (it accepts several Prolog lines)
        index = "" if cluster.name == "d12" else r"\[0\]"
        assert re.findall(r"^Prolog(?:\[\d+\])?\s+= .*$", running, re.M) == [
            re.search(r"^Prolog%s\s+= /etc/slurm/prolog\.d/\*$" % index, running, re.M).group(0)]
        assert re.findall(r"^Epilog(?:\[\d+\])?\s+= .*$", running, re.M) == [
            re.search(r"^Epilog%s\s+= /etc/slurm/epilog\.d/\*$" % index, running, re.M).group(0)]
        flags = re.search(r"^PrologFlags\s+= (.*)$", running, re.M).group(1)
        assert set(flags.replace(" ", "").split(",")) == {"Alloc", "DeferBatch"}


def test_hooks_installed_on_the_nodes_only(clusters):
    source = (ROLE / "files" / "hpcobs-slurm-prolog").read_text()
    for cluster in clusters:
        for host in [cluster.gpu1, cluster.gpu2]:
            for path in ["/etc/slurm/prolog.d/hpcobs-slurm-prolog", "/etc/slurm/epilog.d/hpcobs-slurm-epilog"]:
                hook = host.file(path)
                assert (hook.user, hook.group, hook.mode) == ("root", "root", 0o755)
                assert hook.content_string == source
            conf = host.file(HOOKS_CONF)
            assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o644)
            settings = [line for line in conf.content_string.splitlines() if line and not line.startswith("#")]
            # sh assignments, every value quoted by the role (filter_plugins/hpcobs_slurm_hooks.py)
            assert settings == ["MAPPING_DIR='/run/hpcobs/dcgm-job-mapping'",
                                "TEXTFILE_DIR='/var/lib/node_exporter/textfile'", "GPU_MAP=''", "MIG_MAP=''",
                                "LOCK_SCOPE='dir'", "LOCK_TIMEOUT='10'", "LOG_TAG='hpcobs-slurm-hooks'",
                                "LOGGER='logger'"]
            mapping = host.file(MAPPING)
            assert mapping.is_directory and (mapping.user, mapping.mode) == ("root", 0o755)
            # the dcgm_exporter role declares the directory to systemd-tmpfiles; slurm_hooks adds no entry of its own
            assert host.file("/etc/tmpfiles.d/hpcobs-dcgm-job-mapping.conf").exists
            assert not host.file("/etc/tmpfiles.d/hpcobs-slurm-hooks.conf").exists
            assert host.check_output("hpcobs-slurm-hooks-check /etc/slurm/prolog.d/hpcobs-slurm-prolog %s 0-3",
                                     HOOKS_CONF) == "mapping: 0 1 2 3"
        assert not cluster.ctl.file("/etc/slurm/prolog.d/hpcobs-slurm-prolog").exists
        assert cluster.ctl.check_output("test -x /usr/local/bin/hpcobs-lab-jobs && echo yes") == "yes"


# --- Jobs ---------------------------------------------------------------------------------------------------------

def test_jobs_are_attributed_while_they_run_and_cleaned_after(clusters):
    started = int(time.time()) - 1
    tag = uuid.uuid4().hex[:8]
    jobs = {}
    for cluster in clusters:
        gpu1, gpu2 = sorted(cluster.node_names)
        jobs[cluster.name] = {
            # two jobs share gpu1; one job takes every GPU of gpu2
            "a": (submit(cluster, "alice", "physics", 1, gpu1), "alice", "physics", 1, gpu1),
            "b": (submit(cluster, "bob", "chemistry", 3, gpu1, release="/tmp/release-b-" + tag), "bob", "chemistry", 3, gpu1),
            "c": (submit(cluster, "carol", "physics", 4, gpu2), "carol", "physics", 4, gpu2),
        }
    try:
        for cluster in clusters:
            for job, *_ in jobs[cluster.name].values():
                wait_running(cluster, job)

        # While all three run: exact mapping files, exact job-info files, both exporters show the jobs.
        for cluster in clusters:
            owner = {}
            for job, user, account, gpus, node in jobs[cluster.name].values():
                indices = gpu_indices(cluster, job)
                assert len(indices) == gpus
                for index in indices:
                    owner[(node, str(index))] = job
            for node, host in cluster.node_names.items():
                want = {index: owner[(n, index)] + "," for (n, index) in owner if n == node}
                wait_until("mapping files on %s" % node, lambda: mapping_files(host) == want, timeout=30)
                want_prom = sorted("hpcobs_slurm_job_%s.prom" % job for job, *_, n in jobs[cluster.name].values() if n == node)
                wait_until("job-info files on %s" % node, lambda: prom_files(host) == want_prom, timeout=30)
            for job, user, account, gpus, node in jobs[cluster.name].values():
                host = cluster.node_names[node]
                info = host.file("%s/hpcobs_slurm_job_%s.prom" % (TEXTFILE, job))
                assert info.content_string == expected_prom(job, user, account, gpus)
                assert (info.user, info.mode) == ("root", 0o644)
                metrics = scrape(host, 9100)
                assert ('hpcobs_slurm_job_info{account="%s",hpc_job="%s",partition="gpu",user="%s"} 1'
                        % (account, job, user)) in metrics.splitlines()
                assert 'hpcobs_slurm_job_gpus{hpc_job="%s"} %d' % (job, gpus) in metrics.splitlines()
            for node, host in cluster.node_names.items():
                by_gpu = dcgm_jobs_by_gpu(host)
                assert by_gpu == {index: {owner[(node, index)]} for index in ("0", "1", "2", "3")}, (node, by_gpu)
                assert re.search(r"^node_textfile_scrape_error 0$", scrape(host, 9100), re.M)

        # Cancel a: its GPU is free again, b keeps its three.
        for cluster in clusters:
            a = jobs[cluster.name]["a"]
            cluster.ctl.check_output("scancel %s", a[0])
        for cluster in clusters:
            a, b = jobs[cluster.name]["a"], jobs[cluster.name]["b"]
            wait_gone(cluster, a[0])
            host = cluster.node_names[a[4]]
            files = mapping_files(host)
            assert sorted(files.values()) == ["", b[0] + ",", b[0] + ",", b[0] + ","], files
            assert prom_files(host) == ["hpcobs_slurm_job_%s.prom" % b[0]]
            assert 'hpc_job="%s"' % a[0] not in scrape(host, 9100)
            assert all(jobs_ <= {b[0]} for jobs_ in dcgm_jobs_by_gpu(host).values())

        # b ends by itself (exit 0) once released; c is cancelled: nothing is left on any node.
        for cluster in clusters:
            b, c = jobs[cluster.name]["b"], jobs[cluster.name]["c"]
            cluster.node_names[b[4]].check_output("touch /tmp/release-b-%s", tag)
            cluster.ctl.check_output("scancel %s", c[0])
        for cluster in clusters:
            b, c = jobs[cluster.name]["b"], jobs[cluster.name]["c"]
            wait_gone(cluster, b[0])
            wait_gone(cluster, c[0])
            detail = cluster.ctl.check_output("scontrol show job %s", b[0])
            assert "JobState=COMPLETED" in detail and "ExitCode=0:0" in detail
            for node in cluster.node_names:
                assert_clean(cluster, node)
                assert sorted(mapping_files(cluster.node_names[node])) == ["0", "1", "2", "3"]
            assert_no_node_drained(cluster)
            # normal jobs make the hooks log nothing at all
            for host in cluster.node_names.values():
                assert hook_log(host, started) == ""
    finally:
        for cluster in clusters:
            cluster.ctl.run("scancel --name=hpcobs-verify")
            for host in cluster.node_names.values():
                host.run("rm -f /tmp/release-b-%s", tag)

def test_lab_job_mix(clusters):
    """hpcobs-lab-jobs (make lab-jobs): six jobs across the users and both accounts, four running at once."""
    try:
        submitted = {}
        for cluster in clusters:
            out = cluster.ctl.check_output("hpcobs-lab-jobs -d 300")
            rows = re.findall(r"^job (\d+): user (\w+), account (\w+), (\d) GPU\(s\), (\d+) s$", out, re.M)
            assert len(rows) == 6, out
            assert [(user, account, gpus) for _, user, account, gpus, _ in rows] == [
                ("alice", "physics", "1"), ("bob", "chemistry", "3"), ("carol", "physics", "2"),
                ("alice", "physics", "2"), ("bob", "chemistry", "4"), ("carol", "physics", "1")]
            submitted[cluster.name] = rows
        for cluster in clusters:
            def running():
                out = cluster.ctl.check_output("squeue --noheader --name=hpcobs-lab --states=RUNNING --format=%i")
                return out.split() if len(out.split()) == 4 else None
            # 2 nodes x 2 CPUs: four jobs run, two wait
            run_ids = wait_until("four lab jobs running on %s" % cluster.name, running)
            status = cluster.ctl.check_output("hpcobs-lab-jobs status")
            assert len(status.splitlines()) == 7, status
            for job, user, account, gpus, _ in submitted[cluster.name]:
                assert re.search(r"^\s*%s\s+%s\s+%s\s+(RUNNING|PENDING)\s" % (job, user, account), status, re.M), status
            expected = {}
            for job, user, account, gpus, _ in submitted[cluster.name]:
                if job in run_ids:
                    node = cluster.ctl.check_output("squeue --noheader --jobs=%s --format=%%N", job)
                    expected.setdefault(node, []).append("hpcobs_slurm_job_%s.prom" % job)
            for node, files in expected.items():
                host = cluster.node_names[node]
                wait_until("job-info files of the mix on %s" % node, lambda: prom_files(host) == sorted(files), timeout=30)
        for cluster in clusters:
            assert cluster.ctl.check_output("hpcobs-lab-jobs cancel") == "cancelled every lab job"
    finally:
        for cluster in clusters:
            cluster.ctl.run("scancel --name=hpcobs-lab")
    for cluster in clusters:
        wait_until("the mix gone on %s" % cluster.name,
                   lambda: cluster.ctl.check_output("squeue --noheader --name=hpcobs-lab") == "")
        for node in cluster.node_names:
            assert_clean(cluster, node)
        assert_no_node_drained(cluster)


# --- Bad input and faults under Slurm: the job runs, the node is not drained, the hooks say why in the journal -----

BAD_CASES = {
    "read-only textfile dir": {
        "setup": "mount -t tmpfs -o ro,size=64k hpcobs-verify %s" % TEXTFILE,
        "teardown": "umount %s" % TEXTFILE,
        "log": [r"^prolog job {job}: textfile dir %s is not writable; skipped$" % TEXTFILE],
        "mapping": True, "prom": False,
    },
    "full textfile dir": {
        "setup": "mount -t tmpfs -o size=4k hpcobs-verify %s && { dd if=/dev/zero of=%s/filler bs=4k count=2 "
                 "2>/dev/null; true; }" % (TEXTFILE, TEXTFILE),
        "teardown": "umount %s" % TEXTFILE,
        "log": [r"^prolog job {job}: cannot write %s/\.staging/hpcobs_slurm_job_{job}\.prom \(disk full\?\); "
                r"no job-info metric$" % TEXTFILE],
        "mapping": True, "prom": False,
    },
    "missing mapping dir": {
        "setup": "mv %s %s.verify-aside" % (MAPPING, MAPPING),
        "teardown": "mv %s.verify-aside %s" % (MAPPING, MAPPING),
        "log": [r"^prolog job {job}: mapping dir %s is missing or not a directory; skipped$" % MAPPING,
                r"^epilog job {job}: mapping dir %s is missing or not a directory; skipped$" % MAPPING],
        "mapping": False, "prom": True,
    },
    "broken config": {
        "setup": "cp -p %s %s.verify-backup && echo 'THIS IS NOT A SETTING' >> %s" % (HOOKS_CONF, HOOKS_CONF, HOOKS_CONF),
        "teardown": "mv -f %s.verify-backup %s" % (HOOKS_CONF, HOOKS_CONF),
        "log": [r"^prolog job {job}: config %s: not a working sh fragment \(status 127\); nothing done$" % HOOKS_CONF,
                r"^epilog job {job}: config %s: not a working sh fragment \(status 127\); removing the job all the "
                r"same$" % HOOKS_CONF],
        "mapping": False, "prom": False,
    },
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_under_slurm_never_drains_a_node(clusters, case):
    spec = BAD_CASES[case]
    tag = uuid.uuid4().hex[:8]
    started = int(time.time()) - 1
    hosts = {cluster.name: cluster.gpu2 for cluster in clusters}
    jobs = {}
    try:
        for cluster in clusters:
            hosts[cluster.name].check_output(spec["setup"])
        for cluster in clusters:
            node = sorted(cluster.node_names)[1]
            jobs[cluster.name] = submit(cluster, "carol", "physics", 2, node, release="/tmp/release-%s" % tag)
        for cluster in clusters:
            job, host = jobs[cluster.name], hosts[cluster.name]
            wait_running(cluster, job)
            wait_until("the prolog's report on %s" % cluster.name,
                       lambda: re.search(spec["log"][0].format(job=job), hook_log(host, started), re.M), timeout=30)
            listed = sorted(name for name, content in mapping_files(host).items() if content == job + ",") \
                if host.file(MAPPING).exists else []
            assert listed == ([str(i) for i in gpu_indices(cluster, job)] if spec["mapping"] else []), listed
            assert prom_files(host) == (["hpcobs_slurm_job_%s.prom" % job] if spec["prom"] else [])
            if case == "full textfile dir":
                # nothing half-written is left behind
                assert host.check_output("ls -A %s", TEXTFILE).split() == [".staging", "filler"]
                assert host.check_output("ls -A %s/.staging", TEXTFILE) == ""
            assert node_states(cluster)[sorted(cluster.node_names)[1]] in ("mix", "alloc")
            host.check_output("touch /tmp/release-%s", tag)
        for cluster in clusters:
            job, host = jobs[cluster.name], hosts[cluster.name]
            wait_gone(cluster, job)
            detail = cluster.ctl.check_output("scontrol show job %s", job)
            assert "JobState=COMPLETED" in detail and "ExitCode=0:0" in detail
            lines = hook_log(host, started).splitlines()
            patterns = [p.format(job=job) for p in spec["log"]]
            assert len(lines) == len(patterns), lines
            for line, pattern in zip(lines, patterns):
                assert re.match(pattern, line), (line, pattern)
            assert_no_node_drained(cluster)
    finally:
        for cluster in clusters:
            cluster.ctl.run("scancel --name=hpcobs-verify")
        for cluster in clusters:
            wait_until("no verify job left on %s" % cluster.name,
                       lambda: cluster.ctl.check_output("squeue --noheader --name=hpcobs-verify") == "", timeout=60)
            hosts[cluster.name].run(spec["teardown"])
            hosts[cluster.name].run("rm -f /tmp/release-%s", tag)
    for cluster in clusters:
        assert_clean(cluster, sorted(cluster.node_names)[1])
        assert hosts[cluster.name].check_output("hpcobs-slurm-hooks-check /etc/slurm/prolog.d/hpcobs-slurm-prolog "
                                                "%s 0-3", HOOKS_CONF) == "mapping: 0 1 2 3"


CONFIG_BREAKS = {
    "a line that is not a setting": ("echo 'THIS IS NOT A SETTING' >> %s" % HOOKS_CONF,
                                     r"not a working sh fragment \(status 127\)"),
    "a config that is not root's": ("chown 65534 %s" % HOOKS_CONF, r"not owned by root; not read"),
}


@pytest.mark.parametrize("case", list(CONFIG_BREAKS))
def test_config_broken_while_a_job_runs_still_lets_the_epilog_remove_it(clusters, case):
    """The prolog maps the job; the config then breaks; the epilog removes the job all the same."""
    setup, problem = CONFIG_BREAKS[case]
    tag = uuid.uuid4().hex[:8]
    started = int(time.time()) - 1
    hosts = {cluster.name: cluster.gpu2 for cluster in clusters}
    jobs = {}
    try:
        for cluster in clusters:
            hosts[cluster.name].check_output("cp -p %s %s.verify-backup", HOOKS_CONF, HOOKS_CONF)
            node = sorted(cluster.node_names)[1]
            jobs[cluster.name] = submit(cluster, "carol", "physics", 2, node, release="/tmp/release-%s" % tag)
        for cluster in clusters:
            job, host = jobs[cluster.name], hosts[cluster.name]
            wait_running(cluster, job)
            wait_until("job %s mapped on %s" % (job, cluster.name),
                       lambda: prom_files(host) == ["hpcobs_slurm_job_%s.prom" % job])
            listed = sorted(name for name, content in mapping_files(host).items() if content == job + ",")
            assert listed == [str(i) for i in gpu_indices(cluster, job)], listed
            host.check_output(setup)
            host.check_output("touch /tmp/release-%s", tag)
        for cluster in clusters:
            job, host = jobs[cluster.name], hosts[cluster.name]
            wait_gone(cluster, job)
            assert "JobState=COMPLETED" in cluster.ctl.check_output("scontrol show job %s", job)
            assert_clean(cluster, sorted(cluster.node_names)[1])
            lines = hook_log(host, started).splitlines()
            assert len(lines) == 1, lines
            assert re.match(r"^epilog job %s: config %s: %s; removing the job all the same$"
                            % (job, HOOKS_CONF, problem), lines[0]), lines
            assert_no_node_drained(cluster)
    finally:
        for cluster in clusters:
            cluster.ctl.run("scancel --name=hpcobs-verify")
        for cluster in clusters:
            wait_until("no verify job left on %s" % cluster.name,
                       lambda: cluster.ctl.check_output("squeue --noheader --name=hpcobs-verify") == "", timeout=60)
            hosts[cluster.name].run("mv -f %s.verify-backup %s", HOOKS_CONF, HOOKS_CONF)
            hosts[cluster.name].run("rm -f /tmp/release-%s", tag)
    for cluster in clusters:
        assert hosts[cluster.name].check_output("hpcobs-slurm-hooks-check /etc/slurm/prolog.d/hpcobs-slurm-prolog "
                                                "%s 0-3", HOOKS_CONF) == "mapping: 0 1 2 3"


# --- The role's slurm.conf handling on a site's own files ---------------------------------------------------------

@pytest.fixture(scope="module")
def role_cases(clusters):
    """Run role-cases.yml once (scratch copies of slurm.conf on the controllers) and read what each case recorded."""
    scenario = Path(__file__).resolve().parents[1]
    project = scenario.parents[1]
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(project / "roles"), ANSIBLE_CONFIG=str(project / "ansible.cfg"),
               ANSIBLE_FORCE_COLOR="0", PY_COLORS="0")
    proc = subprocess.run(["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                           str(scenario / "role-cases.yml")], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results = {}
    for cluster in clusters:
        read = {}
        for name in ["merge", "conflict"]:
            read[name] = json.loads(cluster.ctl.check_output("cat /tmp/hpcobs-role-cases/%s.json", name))
        for name in ["merge", "conflict"]:
            read[name + "-conf"] = cluster.ctl.file("/tmp/hpcobs-role-cases/%s/slurm.conf" % name).content_string
        results[cluster.name] = read
    return results


def test_role_merges_alloc_into_a_site_prolog_flags(clusters, role_cases):
    for cluster in clusters:
        cases = role_cases[cluster.name]
        assert cases["merge"] == {"changed": True, "merged": ["PrologFlags=Contain -> PrologFlags=Alloc,Contain"],
                                  "added": ["Prolog=/etc/slurm/prolog.d/*", "Epilog=/etc/slurm/epilog.d/*"]}
        assert cases["merge-conf"].splitlines() == [
            "# a site's slurm.conf: pam_slurm_adopt wants Contain", "ClusterName=site", "PrologFlags=Alloc,Contain",
            "# hpcobs slurm_hooks role: job attribution prolog/epilog (see that role's README before changing)",
            "Prolog=/etc/slurm/prolog.d/*", "Epilog=/etc/slurm/epilog.d/*", "",
            "NodeName=n[1-4] CPUs=8", "PartitionName=batch Nodes=ALL Default=YES"]
        assert cluster.ctl.file("/tmp/hpcobs-role-cases/merge/slurm.conf").mode == 0o640


def test_role_refuses_a_site_prolog_and_explains_the_ways_forward(clusters, role_cases):
    site = "ClusterName=site\nProlog=/usr/local/sbin/site-prolog\nNodeName=n[1-4] CPUs=8\n"
    for cluster in clusters:
        cases = role_cases[cluster.name]
        assert cases["conflict"]["failed"] is True
        assert cases["conflict"]["task"] == "Refuse to replace the site's own Prolog or Epilog"
        msg = " ".join(cases["conflict"]["msg"].split())
        assert "Prolog=/usr/local/sbin/site-prolog (/tmp/hpcobs-role-cases/conflict/slurm.conf line 2;" in msg
        assert "(1) move the site's script into /etc/slurm/prolog.d/" in msg
        assert "(2) keep managing slurm.conf yourself: set slurm_hooks_manage_slurm_conf to false" in msg
        assert "the role changed nothing" in msg
        assert cases["conflict-conf"] == site
        # the live cluster was never reconfigured with the scratch files
        assert "ClusterName=site" not in cluster.ctl.check_output("scontrol show config")


def test_role_stops_on_a_gpu_node_missing_what_the_hooks_need_before_installing_anything(clusters, role_cases):
    """The role's one probe of a node (library/hpcobs_slurm_probe.py) finds the textfile directory missing, or no
    tmpfiles.d entry for a mapping directory under /run: the role stops at the check that explains it, and the
    hooks' configuration still names the directories converge gave it."""
    expected = {
        "no-textfile-dir": ("Check the textfile collector directory exists",
                            "/var/lib/hpcobs-missing-textfile (slurm_hooks_textfile_dir) is not a directory on"),
        "undeclared-mapping-dir": ("Check the mapping directory comes back after a reboot",
                                   "/run/hpcobs-undeclared-mapping is under /run, which is empty after every boot, "
                                   "and no tmpfiles.d entry declares it"),
    }
    for cluster in clusters:
        for node in (cluster.gpu1, cluster.gpu2):
            for case, (task, message) in expected.items():
                record = json.loads(node.check_output("cat /tmp/hpcobs-role-cases/%s.json", case))
                assert record["failed"] is True and record["task"] == task, (node, case, record)
                assert message in " ".join(record["msg"].split()), record["msg"]
                assert "Nothing was changed." in record["msg"]
            assert not node.file("/var/lib/hpcobs-missing-textfile").exists
            assert not node.file("/run/hpcobs-undeclared-mapping").exists
            conf = node.file(HOOKS_CONF).content_string
            assert "/run/hpcobs/dcgm-job-mapping" in conf and "/var/lib/node_exporter/textfile" in conf
            assert "hpcobs-undeclared" not in conf and "hpcobs-missing" not in conf
