"""Filters of the grafana role for dashboards exported from grafana.com (community dashboards 12239, 1860, ...).

A dashboard exported "for sharing externally" names its datasources through `__inputs`: panels say
`"datasource": "${DS_PROMETHEUS}"` (old schema) or `{"type": "prometheus", "uid": "${DS_PROMETHEUS}"}`, and Grafana's
import dialog asks which datasource to use. File provisioning has no such dialog and leaves the placeholders as they
are, so every panel would show "datasource ${DS_PROMETHEUS} was not found". grafana_rewrite_datasources does what the
import dialog does, for the datasources the role provisions:

- every `${<input name>}` of a datasource input becomes the uid of the provisioned datasource of the input's plugin
  type (a `datasource` field that was only the placeholder string becomes a `{type, uid}` reference);
- every `${<input name>}` of a constant input becomes the input's value;
- a template variable of type `datasource` for that plugin type defaults to the provisioned datasource;
- `__inputs` is dropped and the numeric `id` cleared (Grafana assigns one); the dashboard's `uid` is kept.

A datasource input whose plugin type the role does not provision, and any `${DS_...}` left over, are errors: the
dashboard would not work, the play stops naming the dashboard and the input.
"""

from __future__ import annotations

import copy
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used outside Ansible (unit tests)
    AnsibleFilterError = ValueError

_LEFTOVER = re.compile(r"\$\{DS_[A-Za-z0-9_]+\}")


def _replace_in_string(text, replacements):
    for placeholder, value in replacements.items():
        text = text.replace(placeholder, value)
    return text


def grafana_rewrite_datasources(dashboard, datasources, name="dashboard"):
    """Return a copy of `dashboard` with its `__inputs` resolved.

    datasources: {plugin type: {"type": ..., "uid": ...}}, e.g. {"prometheus": {"type": "prometheus",
    "uid": "hpcobs-vm"}}. name: used in error messages (e.g. "nvidia-dcgm-exporter (grafana.com 12239 r2)").
    """
    if not isinstance(dashboard, dict):
        raise AnsibleFilterError("%s: not a dashboard (a JSON object is expected)" % name)
    if "panels" not in dashboard and "rows" not in dashboard:
        raise AnsibleFilterError("%s: not a dashboard (no panels)" % name)
    model = copy.deepcopy(dashboard)
    refs = {}       # "${DS_X}" -> {"type", "uid"}
    constants = {}  # "${VAR_X}" -> value
    for item in model.pop("__inputs", None) or []:
        placeholder = "${%s}" % item.get("name", "")
        if item.get("type") == "datasource":
            plugin = item.get("pluginId", "")
            if plugin not in datasources:
                raise AnsibleFilterError(
                    "%s needs a %s datasource (input %s) but the role provisions only %s"
                    % (name, plugin or "(unnamed)", item.get("name"), ", ".join(sorted(datasources)) or "none"))
            refs[placeholder] = {"type": datasources[plugin]["type"], "uid": datasources[plugin]["uid"]}
        elif item.get("type") == "constant":
            constants[placeholder] = str(item.get("value", ""))
    strings = dict(constants)
    strings.update({placeholder: ref["uid"] for placeholder, ref in refs.items()})

    def walk(node):
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "datasource" and isinstance(value, str) and value in refs:
                    out[key] = dict(refs[value])
                elif key == "datasource" and isinstance(value, dict) and value.get("uid") in refs:
                    ref = dict(value)
                    ref.update(refs[value["uid"]])
                    out[key] = ref
                else:
                    out[key] = walk(value)
            return out
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, str):
            return _replace_in_string(node, strings)
        return node

    model = walk(model)
    by_type = {plugin: ref for plugin, ref in datasources.items()}
    for variable in (model.get("templating") or {}).get("list") or []:
        if variable.get("type") == "datasource" and variable.get("query") in by_type:
            uid = by_type[variable["query"]]["uid"]
            variable["current"] = {"selected": True, "text": uid, "value": uid}
    model["id"] = None
    leftover = sorted(set(_LEFTOVER.findall(_flatten(model))))
    if leftover:
        raise AnsibleFilterError("%s still refers to %s after the rewrite: its __inputs do not declare them"
                                 % (name, ", ".join(leftover)))
    return model


def _flatten(node):
    if isinstance(node, dict):
        return " ".join(_flatten(k) + " " + _flatten(v) for k, v in node.items())
    if isinstance(node, list):
        return " ".join(_flatten(v) for v in node)
    return str(node) if isinstance(node, str) else ""


class FilterModule:
    def filters(self):
        return {"grafana_rewrite_datasources": grafana_rewrite_datasources}
