"""Session fixture: a real conda-pack tarball (CPython 3.10 + numpy 2.2 + pyzmq), built without conda
by envs/packer.py and cached between runs under ~/.cache/inferd-test/condapack (keyed by recipe hash)."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import CACHE, ENV_PACKAGES, pyenv_python


@pytest.fixture(scope="session")
def condapack_env() -> dict[str, Any]:
    """{'tarball', 'python', 'built_from', 'base_prefix', ...} of the cached test environment."""
    from inferd.envs import packer

    base = pyenv_python("3.10.*", "python3.10")
    if base is None:
        pytest.skip("needs a pyenv CPython 3.10 (~/.pyenv/versions/3.10.*) to build a conda-pack env from")
    return packer.build_cached(base, CACHE, ENV_PACKAGES)


