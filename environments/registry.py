"""Environments by name: `make_env("twx", game="coin", ...)`."""

from __future__ import annotations

from typing import Callable

from environments.base import TextEnv

_REGISTRY: dict[str, Callable[..., TextEnv]] = {}


def register_env(name: str):
  """Decorator: registers a TextEnv factory (usually the class) under `name`."""

  def wrap(factory: Callable[..., TextEnv]):
    if name in _REGISTRY:
      raise ValueError(f"environment {name!r} is registered twice")
    _REGISTRY[name] = factory
    return factory

  return wrap


def list_envs() -> list[str]:
  return sorted(_REGISTRY)


def make_env(name: str, **kwargs) -> TextEnv:
  if name not in _REGISTRY:
    raise KeyError(f"unknown environment {name!r}; known: {', '.join(list_envs())}")
  return _REGISTRY[name](**kwargs)
