"""Text environments for agent RL: one protocol, a registry, a host-side pool.

Importing this package registers every environment whose engine is installed.
"""

from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import list_envs, make_env, register_env

import environments.twx_env  # noqa: F401  (registers "twx")
