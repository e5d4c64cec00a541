"""Per-model execution environments (EXECUTION_ENV_PATH): conda-pack tarballs or unpacked env dirs.

`EnvironmentManager.resolve()` turns the parameter's path into an `ExecEnv` (an unpacked, relocated,
probed environment in the cache) that the launcher starts workers in.
"""

from .extract import Limits as EnvLimits
from .manager import EnvError, EnvironmentManager, ExecEnv, default_cache_dir

__all__ = ["EnvError", "EnvLimits", "EnvironmentManager", "ExecEnv", "default_cache_dir"]
