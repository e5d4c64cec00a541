"""Maps the fixed top-level folders onto the `inferd` namespace (see DESIGN.md: Layout)."""

import os

from setuptools import setup

# worker/pytriton is the Python API (inferd.pytriton, PyTriton's surface): worker-side code, but its own
# import name, so that PyTriton users change `pytriton.` to `inferd.pytriton.` and nothing else
ROOTS = {"supervisor": "inferd.supervisor", "worker": "inferd.worker", "envs": "inferd.envs",
         os.path.join("worker", "pytriton"): "inferd.pytriton"}


def find_packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for folder, name in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and os.path.join(dirpath, d) not in ROOTS]
            if "__init__.py" in filenames:
                pkg = name + dirpath[len(folder):].replace(os.sep, ".")
                packages.append(pkg)
                package_dir[pkg] = dirpath
    return packages, package_dir


packages, package_dir = find_packages()
setup(packages=packages, package_dir=package_dir,
      package_data={"inferd.worker": ["compat/*.py"], "inferd.envs": ["*.yml"]})
