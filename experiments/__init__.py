"""Experiments by name.

Each module in this package is one experiment family; its functions decorated with
`@register("name")` return an `ExperimentConfig`. Their docstrings hold what the
experiment is for and the command that launches it (big_vision style).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable

from csa_jax.config import ExperimentConfig

_EXPERIMENTS: dict[str, Callable[[], ExperimentConfig]] = {}


def register(name: str):
  def wrap(fn: Callable[[], ExperimentConfig]):
    if name in _EXPERIMENTS:
      raise ValueError(f"experiment {name!r} is registered twice")
    _EXPERIMENTS[name] = fn
    return fn

  return wrap


def _load_all() -> None:
  for mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{mod.name}")


def list_experiments() -> dict[str, str]:
  """Name -> first line of its docstring."""
  _load_all()
  return {n: (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
          for n, fn in sorted(_EXPERIMENTS.items())}


def get_experiment(name: str) -> ExperimentConfig:
  _load_all()
  if name not in _EXPERIMENTS:
    raise KeyError(f"unknown experiment {name!r}; known: {', '.join(sorted(_EXPERIMENTS))}")
  cfg = _EXPERIMENTS[name]()
  if cfg.name != name:
    cfg = dataclasses.replace(cfg, name=name)
  return cfg
