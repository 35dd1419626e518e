#!/usr/bin/env python3
"""Count what the roles copy from each other, and fail above the ceilings kept in .config/copy-check.yml.

Two measures:
- tasks: tasks and handlers (roles/*/tasks/*.yml, roles/*/handlers/*.yml; the tasks inside a block count one by one)
  that are exact copies of a task of another role once each role's own name is replaced by a placeholder. Every
  copy counts, the first one too: two roles with the same task make 2.
- unit_lines: lines of the unit templates (roles/*/templates/*.service.j2) that another role's unit template also
  has, after the same replacement (blank lines and comments left out).

Not counted, because they hold no logic of their own: a task that only calls a shared role (import_role/include_role
of a role named in `shared_roles`, or a handler's include_tasks of one of its task files) -- that is how a role uses
the shared code -- and a task that only imports a task file of its own role (the tagged phase imports of every
tasks/main.yml). The shared roles themselves are not compared. --all counts those too.

  scripts/copy-check.py            report, exit 1 if a count is above its ceiling
  scripts/copy-check.py --list     also name every copied task and line
"""

import argparse
import collections
import glob
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, ".config", "copy-check.yml")
PLACEHOLDER = "ROLE"
CALLS = ("import_role", "include_role", "ansible.builtin.import_role", "ansible.builtin.include_role")
FILE_CALLS = ("import_tasks", "include_tasks", "ansible.builtin.import_tasks", "ansible.builtin.include_tasks")


def swap_role_name(value, role):
    """value with every occurrence of the role's name (a whole word part, e.g. in _node_exporter_unit) replaced."""
    pattern = re.compile(r"(?<![A-Za-z0-9])%s(?![A-Za-z0-9])" % re.escape(role))
    if isinstance(value, str):
        return pattern.sub(PLACEHOLDER, value)
    if isinstance(value, list):
        return [swap_role_name(item, role) for item in value]
    if isinstance(value, dict):
        return {swap_role_name(str(key), role): swap_role_name(item, role) for key, item in value.items()}
    return value


def flatten(tasks):
    """The tasks of a task file, the tasks of blocks (block/rescue/always) one by one."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        nested = [key for key in ("block", "rescue", "always") if key in task]
        if nested:
            for key in nested:
                yield from flatten(task[key])
        else:
            yield task


def calls_shared_role(task, shared_roles):
    """Whether the task only calls a shared role: import/include_role of it, or (handlers cannot include a role)
    import/include_tasks of a file under its tasks/ (e.g. "{{ role_path }}/../service/tasks/restart.yml")."""
    for key in CALLS:
        if key in task:
            args = task[key]
            name = args.get("name") if isinstance(args, dict) else args
            return name in shared_roles
    for key in FILE_CALLS:
        if key in task:
            args = task[key]
            path = str(args.get("file", "") if isinstance(args, dict) else args)
            return any(re.search(r"(^|/)%s/tasks/[^/]+\.ya?ml$" % re.escape(role), path) for role in shared_roles)
    return False


def canonical(task, role):
    return json.dumps(swap_role_name(task, role), sort_keys=True, default=str)


def imports_own_file(task):
    """Whether the task only imports one of its role's own task files (a plain relative file name)."""
    for key in FILE_CALLS:
        if key in task:
            args = task[key]
            path = str(args.get("file", "") if isinstance(args, dict) else args)
            return re.match(r"^[A-Za-z0-9_.-]+\.ya?ml$", path) is not None
    return False


def role_tasks(roles_dir, shared_roles, count_calls=False):
    """{role: [(file, task name, canonical form)]} of every role but the shared ones."""
    found = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(roles_dir, "*", "tasks", "*.yml"))
                       + glob.glob(os.path.join(roles_dir, "*", "handlers", "*.yml"))):
        role = path.split(os.sep)[-3]
        if role in shared_roles:
            continue
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        for task in flatten(data if isinstance(data, list) else []):
            if not count_calls and (calls_shared_role(task, shared_roles) or imports_own_file(task)):
                continue
            found[role].append((os.path.relpath(path, roles_dir), str(task.get("name", "")), canonical(task, role)))
    return found


def copied_tasks(found):
    """[(file, task name)] of every task whose canonical form appears in two roles or more."""
    roles_of = collections.defaultdict(set)
    for role, tasks in found.items():
        for _, _, form in tasks:
            roles_of[form].add(role)
    return [(path, name) for tasks in found.values() for path, name, form in tasks if len(roles_of[form]) > 1]


def unit_lines(roles_dir, shared_roles):
    """{role/template: [normalised line]}: the unit templates' lines without blanks and comments."""
    units = {}
    for path in sorted(glob.glob(os.path.join(roles_dir, "*", "templates", "*.service.j2"))):
        role = path.split(os.sep)[-3]
        if role in shared_roles:
            continue
        lines = []
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if line and not line.startswith("#") and not line.startswith("{#"):
                    lines.append(swap_role_name(line, role))
        units[os.path.relpath(path, roles_dir)] = lines
    return units


def copied_unit_lines(units):
    """[(template, line)] of every line another role's template also has."""
    roles_of = collections.defaultdict(set)
    for template, lines in units.items():
        for line in set(lines):
            roles_of[line].add(template.split(os.sep)[0])
    return [(template, line) for template, lines in units.items() for line in lines if len(roles_of[line]) > 1]


def load_config(path):
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle) or {}
    for key in ("tasks", "unit_lines"):
        if not isinstance(config.get("ceiling", {}).get(key), int):
            raise SystemExit("%s: ceiling.%s must be an integer" % (path, key))
    config.setdefault("shared_roles", [])
    return config


def measure(roles_dir, shared_roles, count_calls=False):
    found = role_tasks(roles_dir, set(shared_roles), count_calls)
    units = unit_lines(roles_dir, set(shared_roles))
    return {
        "tasks": copied_tasks(found),
        "tasks_total": sum(len(tasks) for tasks in found.values()),
        "unit_lines": copied_unit_lines(units),
        "unit_lines_total": sum(len(lines) for lines in units.values()),
        "unit_templates": len(units),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roles", default=os.path.join(ROOT, "roles"))
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--list", action="store_true", help="name every copied task and unit line")
    parser.add_argument("--all", action="store_true",
                        help="also count calls of the shared roles and imports of a role's own files (report only)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    result = measure(args.roles, config["shared_roles"], args.all)
    if args.all:
        print("copy-check: %d of %d tasks/handlers, calls and imports included" % (len(result["tasks"]),
                                                                                  result["tasks_total"]))
        return 0
    failed = False
    for key, total, what in (("tasks", "tasks_total", "tasks/handlers"),
                             ("unit_lines", "unit_lines_total", "unit template lines")):
        count, ceiling = len(result[key]), config["ceiling"][key]
        verdict = "ok" if count <= ceiling else "ABOVE THE CEILING"
        print("copy-check: %d of %d %s are copies (ceiling %d): %s" % (count, result[total], what, ceiling, verdict))
        if count > ceiling:
            failed = True
    if args.list or failed:
        for path, name in sorted(result["tasks"]):
            print("  task  %s: %s" % (path, name))
        if args.list:
            for template, line in sorted(result["unit_lines"]):
                print("  unit  %s: %s" % (template, line))
    if failed:
        print("copy-check: move the copied tasks into the shared role (roles/%s) and call it; a ceiling in %s may only"
              " go down." % ((config["shared_roles"] or ["service"])[0], os.path.relpath(args.config, ROOT)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
