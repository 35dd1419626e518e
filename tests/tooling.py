"""Where the unit tests find the real binaries they run (vmalert, victoria-metrics, amtool, ...)."""
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> Path:
    """An executable: from $HPCOBS_TOOLS_BIN when set (and only there), else .cache/tools/bin, else PATH; the test
    fails when there is none."""
    env_dir = os.environ.get("HPCOBS_TOOLS_BIN")
    if env_dir:
        path = Path(env_dir) / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
        pytest.fail("%s not found in HPCOBS_TOOLS_BIN=%s (expected an executable %s)" % (name, env_dir, path))
    cached = REPO / ".cache" / "tools" / "bin" / name
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    found = shutil.which(name)
    if found:
        return Path(found)
    pytest.fail("%s not found in %s or on PATH: run make tools" % (name, cached.parent))


SERVICE_ROLE = REPO / "roles" / "service"


def service_unit_vars(role_dir: Path) -> dict:
    """What a role's unit is rendered from: roles/service's defaults with the vars its configure.yml gives the
    shared unit template (its one import_role of service, tasks_from unit). Render SERVICE_ROLE's
    templates/service.service.j2 with them, and ANSIBLE_FILTER_PLUGINS=SERVICE_ROLE/filter_plugins."""
    import yaml

    tasks = yaml.safe_load((role_dir / "tasks" / "configure.yml").read_text())
    calls = [task for task in tasks if (task.get("ansible.builtin.import_role") or {}).get("tasks_from") == "unit"]
    assert len(calls) == 1, "%s/tasks/configure.yml should write its unit through roles/service" % role_dir.name
    values = yaml.safe_load((SERVICE_ROLE / "defaults" / "main.yml").read_text()) or {}
    values.update(calls[0]["vars"])
    return values
