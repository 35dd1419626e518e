"""The counters CSV (dcgm-exporter's -f file)."""

import csv

from .common import log
from .fields import EXPORTER_FIELDS, FIELD_IDS, FIELD_TYPES, PROM_TYPES, dcgm_field_id


# ---------------------------------------------------------------------------
# Counters CSV
# ---------------------------------------------------------------------------


class CsvError(Exception):
    pass


class Counter:
    __slots__ = ("name", "prom_type", "help", "ftype", "field_id")

    def __init__(self, name, prom_type, help_text):
        self.name = name
        self.prom_type = prom_type
        self.help = help_text
        self.ftype = FIELD_TYPES[name]
        self.field_id = FIELD_IDS[name]

    def sort_key(self):
        """dcgm-exporter's family order: its Counter struct (FieldID, FieldName, ...) as text/template sorts it."""
        return (self.field_id, self.name)

    def __repr__(self):
        return "Counter(%r, %r)" % (self.name, self.prom_type)


def _warn(message):
    log("WARN", message)


def parse_counters_csv(text, warn=_warn):
    """Parse a dcgm-exporter counters CSV; raise CsvError where the exporter refuses to start.

    As dcgm-exporter (internal/pkg/counters/counter_config.go, release 4.5.3-4.8.2): a row needs three fields; a
    name must be a DCGM field (current or legacy name) or one of the exporter's own DCGM_EXP_* counters, anything
    else stops the program; the Prometheus type is checked for DCGM fields. The simulator then skips, with a
    warning, the rows it cannot produce: DCGM_EXP_* counters and valid DCGM fields it does not simulate.
    """
    counters = []
    seen = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("#") or not line.strip():
            continue
        try:
            record = next(csv.reader([line]))
        except csv.Error as exc:
            raise CsvError("line %d: %s" % (lineno, exc)) from exc
        record = [field.strip(" ") for field in record]
        if len(record) != 3:
            raise CsvError("malformed CSV record; err: failed to parse line %d (`%s`), "
                           "expected 3 fields" % (lineno, " ".join(record)))
        name, prom_type, help_text = record
        if name in EXPORTER_FIELDS:
            warn("line %d: %s is computed by dcgm-exporter itself and is not simulated; skipping it"
                 % (lineno, name))
            continue
        if dcgm_field_id(name) is None:
            raise CsvError("could not find DCGM field; err: unknown ExporterCounter "
                           "field '%s'" % name)
        if prom_type not in PROM_TYPES:
            raise CsvError("could not find Prometheus metric type '%s'" % prom_type)
        if name not in FIELD_TYPES:
            warn("line %d: DCGM field %s (id %d) is not simulated; skipping it"
                 % (lineno, name, dcgm_field_id(name)))
            continue
        if name in seen:
            raise CsvError("line %d: field %s listed twice (DCGM refuses duplicate "
                           "fields in a field group)" % (lineno, name))
        seen.add(name)
        counters.append(Counter(name, prom_type, help_text))
    return counters


def load_counters(path):
    try:
        with open(path, "r", encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
    except OSError as exc:
        raise CsvError("Could not read metrics file '%s'; err: %s" % (path, exc)) from exc
    return parse_counters_csv(text)
