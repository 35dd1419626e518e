"""The Slurm job mapping directory (the hpc_job label)."""

import os
import re
import stat

from .common import log


# ---------------------------------------------------------------------------
# Job mapping (the hpc_job label)
# ---------------------------------------------------------------------------

MAPPING_NAME_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MAX_TOKEN = 64 * 1024  # bufio.Scanner's default limit


class MappingError(Exception):
    pass


def is_mapping_name(name):
    return MAPPING_NAME_RE.fullmatch(name) is not None


def split_job_lines(data):
    """Line splitting as Go's bufio.ScanLines, then de-duplication."""
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    jobs = []
    seen = set()
    for raw in lines:
        if len(raw) >= MAX_TOKEN:
            raise MappingError("bufio.Scanner: token too long")
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        job = raw.decode("utf-8", "surrogateescape")
        if job in seen:
            continue
        seen.add(job)
        jobs.append(job)
    return jobs


def read_job_file(path):
    """Read one mapping file; any failure raises MappingError."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise MappingError("open %s: %s" % (path, exc.strerror)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MappingError("read %s: not a regular file" % path)
        chunks = []
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError as exc:
                raise MappingError("read %s: %s" % (path, exc.strerror)) from exc
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return split_job_lines(b"".join(chunks))


def read_mapping_dir(dirpath):
    """Return {file name: [job ids]}, or None when the directory is absent.

    Raises MappingError when the directory cannot be listed or a mapping file
    cannot be read: the scrape must then fail as a whole.
    """
    try:
        os.stat(dirpath)
    except OSError:
        return None
    try:
        with os.scandir(dirpath) as iterator:
            entries = sorted(iterator, key=lambda e: e.name)
    except OSError as exc:
        raise MappingError("open %s: %s" % (dirpath, exc.strerror)) from exc
    mapping = {}
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            log("WARN", "HPC mapper: can not get file info", file=entry.name)
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if not is_mapping_name(entry.name):
            continue
        mapping[entry.name] = read_job_file(os.path.join(dirpath, entry.name))
    return mapping
