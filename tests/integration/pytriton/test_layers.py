"""inferd.pytriton is worker-side: importing all of it (clients included) never imports the supervisor."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import inferd.pytriton as api
names = [m.name for m in pkgutil.walk_packages(api.__path__, "inferd.pytriton.")]
for name in names:
    importlib.import_module(name)
assert len(names) >= 10, names
bad = sorted(m for m in sys.modules if m.startswith("inferd.supervisor"))
print("BAD", bad)
"""


def test_the_api_never_imports_the_supervisor():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "BAD []" in out.stdout, out.stdout
