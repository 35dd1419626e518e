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
