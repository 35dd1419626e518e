"""The /metrics body in dcgm-exporter's text format."""

from .fields import XID_FIELD, xid_name
from .model import field_value


def format_value(value, ftype):
    if ftype == "i":
        return "%d" % int(value)
    if ftype == "d":
        return "%f" % float(value)
    return str(value)


# ---------------------------------------------------------------------------
# Rendering in dcgm-exporter's text format
# ---------------------------------------------------------------------------


def render_metrics(counters, entities, mapping, hostname, old_namespace=False,
                   replace_blanks=False, hostname_label="Hostname"):
    """The /metrics body. Families come in field-id order, as dcgm-exporter renders them (see Counter.sort_key);
    hostname_label is "Hostname" or, on newer exporters, "hostname" (see emulate.py)."""
    uuid_label = "uuid" if old_namespace else "UUID"
    label_counters = [c for c in counters if c.prom_type == "label"]
    metric_counters = sorted((c for c in counters if c.prom_type != "label"), key=lambda c: c.sort_key())
    prefixes = {}
    jobs_of = {}
    for entity in entities:
        gpu = entity.gpu
        model = gpu.spec["name"]
        if replace_blanks:
            model = "-".join(model.split())
        parts = ['gpu="%d"' % gpu.index, '%s="%s"' % (uuid_label, gpu.uuid),
                 'pci_bus_id="%s"' % gpu.pci_bus_id, 'device="nvidia%d"' % gpu.index,
                 'modelName="%s"' % model]
        if entity.inst is not None:
            parts.append('GPU_I_PROFILE="%s"' % entity.inst.profile)
            parts.append('GPU_I_ID="%d"' % entity.inst.gi_id)
        if hostname:
            parts.append('%s="%s"' % (hostname_label, hostname))
        labels = {}
        for counter in label_counters:
            value = field_value(counter.name, entity)
            if value is not None:
                labels[counter.name] = format_value(value, counter.ftype)
        for key in sorted(labels):
            parts.append('%s="%s"' % (key, labels[key]))
        prefixes[entity.key] = ",".join(parts)
        jobs_of[entity.key] = (mapping or {}).get(entity.key) or [None]

    out = []
    for counter in metric_counters:
        lines = []
        for entity in entities:
            value = field_value(counter.name, entity)
            if value is None:
                continue
            text = format_value(value, counter.ftype)
            attrs = {}
            if counter.name == XID_FIELD:
                code = int(value)
                attrs["err_code"] = str(code)
                attrs["err_msg"] = xid_name(code)
            prefix = prefixes[entity.key]
            for job in jobs_of[entity.key]:
                extra = dict(attrs)
                if job is not None:
                    extra["hpc_job"] = job
                suffix = "".join(',%s="%s"' % (k, extra[k]) for k in sorted(extra))
                lines.append("%s{%s%s} %s\n" % (counter.name, prefix, suffix, text))
        if lines:
            out.append("# HELP %s %s\n# TYPE %s %s\n" % (counter.name, counter.help,
                                                         counter.name, counter.prom_type))
            out.extend(lines)
    return "".join(out)
