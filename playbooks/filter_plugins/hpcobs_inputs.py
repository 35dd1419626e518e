"""Types of the settings a site gives (inventory, -e), checked against the roles' meta/argument_specs.yml.

`-e key=value` always gives a string: `-e node_exporter_ready_timeout=30` is "30", and a preflight comparing it with
a number then fails with a Jinja TypeError, or a boolean "false" is truthy. Extra vars take precedence over anything
a play sets, so they cannot be coerced in place; preflight.yml refuses them instead, naming the variable, its type
and the JSON form that passes it typed. A setting a role declares with `choices` is checked against them there
too, for every host before any role runs. Pure functions, unit-tested in tests/test_inputs.py.
"""

import glob
import json
import os

import yaml

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

CHECKED = ("int", "float", "bool", "list", "dict")
UNSET = "__hpcobs_unset__"  # what preflight.yml's vars lookup gives for a setting nobody set


def argument_types(spec_texts):
    """{variable: (type, role)} from the text of every role's meta/argument_specs.yml ([(role, text)] pairs)."""
    types = {}
    for role, text in spec_texts:
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise AnsibleFilterError("roles/%s/meta/argument_specs.yml is not YAML: %s" % (role, exc))
        for entry in (data.get("argument_specs") or {}).values():
            for name, option in ((entry or {}).get("options") or {}).items():
                kind = (option or {}).get("type", "str")
                if kind in CHECKED:
                    types.setdefault(str(name), (kind, role))
    return types


def argument_choices(spec_texts):
    """{variable: (choices, role)} of every option that declares `choices` ([(role, text)] pairs)."""
    choices = {}
    for role, text in spec_texts:
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise AnsibleFilterError("roles/%s/meta/argument_specs.yml is not YAML: %s" % (role, exc))
        for entry in (data.get("argument_specs") or {}).values():
            for name, option in ((entry or {}).get("options") or {}).items():
                allowed = (option or {}).get("choices")
                if isinstance(allowed, list) and allowed:
                    choices.setdefault(str(name), (allowed, role))
    return choices


def _spec_texts(roles_dir):
    pairs = []
    for path in sorted(glob.glob(os.path.join(str(roles_dir), "*", "meta", "argument_specs.yml"))):
        with open(path, encoding="utf-8") as handle:
            pairs.append((path.split(os.sep)[-3], handle.read()))
    if not pairs:
        raise AnsibleFilterError("no roles/*/meta/argument_specs.yml under %s" % roles_dir)
    return pairs


def roles_argument_types(roles_dir):
    """argument_types of every roles/<role>/meta/argument_specs.yml under roles_dir."""
    return argument_types(_spec_texts(roles_dir))


def roles_argument_choices(roles_dir):
    """argument_choices of every roles/<role>/meta/argument_specs.yml under roles_dir."""
    return argument_choices(_spec_texts(roles_dir))


def _is(kind, value):
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, (list, tuple))
    return isinstance(value, dict)


def _typed_example(kind, value):
    """What the value most likely meant, as JSON, or None when it has no sensible typed reading."""
    text = str(value).strip()
    try:
        if kind == "int":
            return json.dumps(int(text))
        if kind == "float":
            return json.dumps(float(text))
        if kind == "bool":
            lowered = text.lower()
            if lowered in ("true", "yes", "on", "1"):
                return "true"
            if lowered in ("false", "no", "off", "0"):
                return "false"
            return None
        loaded = json.loads(text)
        return json.dumps(loaded) if _is(kind, loaded) else None
    except (TypeError, ValueError):
        return None


def _chosen(value, allowed):
    """Whether value is one of allowed, compared as Ansible's argument spec does (the value as a string for str
    choices, so that `-e level=info` passes)."""
    if value in allowed:
        return True
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and \
        str(value) in [str(a) for a in allowed if isinstance(a, str)]


def mistyped(values, types, choices=None):
    """Messages for each given setting whose type is not the one its role declares, or whose value is not one of
    the role's declared choices.

    values: {variable: value}; None or UNSET stand for a setting nobody gave, and are skipped.
    """
    problems = []
    for name in sorted(values):
        value = values[name]
        if value is None or value == UNSET:
            continue
        if choices and name in choices and (name not in types or _is(types[name][0], value)):
            allowed, role = choices[name]
            if not _chosen(value, allowed):
                problems.append("%s is %s, but roles/%s allows only %s"
                                % (name, json.dumps(value, default=str), role,
                                   ", ".join(json.dumps(a, default=str) for a in allowed)))
            continue
        if name not in types:
            continue
        kind, role = types[name]
        if _is(kind, value):
            continue
        example = _typed_example(kind, value)
        hint = ("; from the command line pass it typed, as JSON: -e '{\"%s\": %s}'" % (name, example)
                if example is not None and isinstance(value, str) else "")
        problems.append("%s is %s %s, but roles/%s declares it %s%s"
                        % (name, "the string" if isinstance(value, str) else "a %s:" % type(value).__name__,
                           json.dumps(value, default=str), role, kind, hint))
    return problems


class FilterModule:
    def filters(self):
        return {"hpcobs_argument_types": argument_types, "hpcobs_roles_argument_types": roles_argument_types,
                "hpcobs_roles_argument_choices": roles_argument_choices, "hpcobs_mistyped": mistyped}
