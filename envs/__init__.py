"""Environment specs (`*.yml`, conda environment files) and the packer behind `infer-ctl env pack`."""

import os

SPEC_DIR = os.path.dirname(os.path.abspath(__file__))


def spec_path(name: str) -> str:
    """`minimal` -> the bundled spec file; a path is returned unchanged."""
    if os.path.sep in name or name.endswith((".yml", ".yaml")):
        return name
    return os.path.join(SPEC_DIR, name + ".yml")


def bundled_specs() -> list[str]:
    return sorted(n[:-4] for n in os.listdir(SPEC_DIR) if n.endswith(".yml"))
