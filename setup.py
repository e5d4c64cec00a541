"""Maps the fixed top-level folders onto the `inferd` namespace (see DESIGN.md: Layout) and generates the
gRPC modules (protos/generate.py -> supervisor/_gen) as part of every build: wheel, sdist-built wheel and
editable install alike, so `pip install <checkout>` needs no `make protos` first. grpcio-tools is a build
requirement (pyproject.toml [build-system])."""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

# pytriton/ is the Python API (inferd.pytriton, PyTriton's surface): worker-side code with its own
# import name, so that PyTriton users change `pytriton.` to `inferd.pytriton.` and nothing else
ROOTS = {"supervisor": "inferd.supervisor", "worker": "inferd.worker", "envs": "inferd.envs",
         "pytriton": "inferd.pytriton"}
GEN_PACKAGE, GEN_DIR = "inferd.supervisor._gen", os.path.join("supervisor", "_gen")


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
    # generated at build time (not in git, not in the sdist): declared whether or not it exists yet
    if GEN_PACKAGE not in packages:
        packages.append(GEN_PACKAGE)
        package_dir[GEN_PACKAGE] = GEN_DIR
    return packages, package_dir


def generate_protos() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_inferd_protos", os.path.join(here, "protos", "generate.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if module.generate() != 0:
        raise SystemExit("protos/generate.py failed: the gRPC modules could not be generated")


class BuildPyWithProtos(build_py):
    """build_py that first generates supervisor/_gen (idempotent: a no-op when it is up to date)."""

    def run(self) -> None:
        generate_protos()
        super().run()

    def get_source_files(self) -> list[str]:  # sdist: the generated modules are rebuilt, not shipped
        generate_protos()  # the declared package must exist for setuptools to list the others
        return [f for f in super().get_source_files() if not f.startswith(GEN_DIR + os.sep)]


packages, package_dir = find_packages()
setup(packages=packages, package_dir=package_dir,
      package_data={"inferd.worker": ["compat/*.py"], "inferd.envs": ["*.yml"],
                    GEN_PACKAGE: ["*.pyi"]},
      cmdclass={"build_py": BuildPyWithProtos})
