"""The Prometheus text exposition format, read the way the checks need it: {(name, sorted labels): value}.

Used by the unit tests (tests/) and the scenarios' testinfra modules (pytest.ini puts this directory on the path).
"""
import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """Every sample of `text`; fails on a line that is not a sample or comment, and on a series given twice."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, "not an exposition line: %r" % line
        key = (match.group(1), tuple(sorted(LABEL.findall(match.group(2) or ""))))
        assert key not in samples, "duplicate series %s" % (key,)
        samples[key] = float(match.group(3))
    return samples


def value(samples, name, **labels):
    """The value of the series `name` with exactly these labels, None when there is none."""
    return samples.get((name, tuple(sorted(labels.items()))))
