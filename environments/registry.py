"""Environments by name: `make_env("twx", game="coin", ...)`."""

from __future__ import annotations

import importlib.metadata
from typing import Callable

from environments.base import TextEnv

_REGISTRY: dict[str, Callable[..., TextEnv]] = {}
_VERSIONS: dict[str, tuple[int, tuple[str, ...]]] = {}


def register_env(name: str, *, revision: int = 1, engines: tuple[str, ...] = ()):
  """Decorator: registers a TextEnv factory (usually the class) under `name`.

  `revision` is the adapter's own version (bump it when what it shows the agent changes:
  observations, action lists, rewards) and `engines` the distributions whose versions
  shape its episodes; together they are `env_version(name)`, which keys caches.
  """

  def wrap(factory: Callable[..., TextEnv]):
    if name in _REGISTRY:
      raise ValueError(f"environment {name!r} is registered twice")
    _REGISTRY[name] = factory
    _VERSIONS[name] = (revision, tuple(engines))
    return factory

  return wrap


def env_version(name: str) -> str:
  """e.g. "twx r1, textworld-express 1.1.0": what demonstrations were made with."""
  if name not in _VERSIONS:
    raise KeyError(f"unknown environment {name!r}; known: {', '.join(list_envs())}")
  revision, engines = _VERSIONS[name]
  parts = [f"{name} r{revision}"]
  for dist in engines:
    try:
      parts.append(f"{dist} {importlib.metadata.version(dist)}")
    except importlib.metadata.PackageNotFoundError:
      parts.append(f"{dist} (not installed)")
  return ", ".join(parts)


def list_envs() -> list[str]:
  return sorted(_REGISTRY)


def make_env(name: str, **kwargs) -> TextEnv:
  if name not in _REGISTRY:
    raise KeyError(f"unknown environment {name!r}; known: {', '.join(list_envs())}")
  return _REGISTRY[name](**kwargs)
