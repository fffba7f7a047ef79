"""Text environments for agent RL: one protocol, a registry, a host-side pool.

Importing this package registers every environment whose engine is installed.
"""

from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import list_envs, make_env, register_env
if __import__("importlib.util").util.find_spec("alfworld"): import environments.alfworld_env  # noqa: E701,F401,E501 ALFWorld, only where its engine is installed
