"""After training: evaluate a saved policy, export it to Hugging Face, watch it play.

  python launch.py --workdir RUN --eval [--step N|sft] [--set eval.num_episodes=50 ...]
  python launch.py --workdir RUN --export-hf DIR [--step N|sft]
  python launch.py --workdir RUN --play 3 [--sample] [--step N|sft]

A run directory holds everything a policy needs: config.json (the run's config), the
tokenizer (tokenizer.json; a pretrained run reads its model_path's), checkpoints/ (RL
steps) and sft/ (the SFT weights). The policy is restored through the trainer's own
checkpoint code (`Checkpointer.restore` into the train state the run saved), and
evaluated by the trainer's `evaluate` with the sampler keys the run's own evaluations used,
so `--eval` of a run's last checkpoint repeats its final held-out numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import textwrap
import types
import typing
from typing import Any, Mapping

from csa_jax.config import ConfigError, ExperimentConfig

CONFIG_FILE = "config.json"
# Keys of config.json that are records of the run, not config (trainer, provenance).
NOT_CONFIG = ("provenance",)


class RunError(ConfigError):
  """A run directory, step or export target that cannot be used (one line says why)."""


# ----------------------------------------------------------------------------------------
# config.json -> ExperimentConfig.


def _from_value(typ: Any, value: Any, key: str) -> Any:
  origin, args = typing.get_origin(typ), typing.get_args(typ)
  if origin in (typing.Union, types.UnionType):
    if value is None:
      return None
    inner = [a for a in args if a is not type(None)]
    return _from_value(inner[0], value, key) if len(inner) == 1 else value
  if dataclasses.is_dataclass(typ):
    if not isinstance(value, Mapping):
      raise RunError(f"{CONFIG_FILE}: {key} should be a section, got {value!r}")
    return from_dict(typ, value, key + ".")
  if origin is tuple:
    return tuple(value)
  if typ is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value


def from_dict(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
  """The dataclass `cls` from its `config.to_dict` form; keys the code no longer has are
  refused (a config.json from other code), missing ones take their defaults."""
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - names - (set(NOT_CONFIG) if not prefix else set()))
  if unknown:
    raise RunError(f"{CONFIG_FILE}: unknown config key {prefix + unknown[0]!r} (written by "
                   "another version of csa-jax?)")
  kwargs = {k: _from_value(hints[k], v, prefix + k) for k, v in data.items() if k in names}
  try:
    return cls(**kwargs)
  except (TypeError, ValueError) as e:
    raise RunError(f"{CONFIG_FILE}: {prefix or 'config'}: {e}") from None


def load_config(workdir: str) -> ExperimentConfig:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise RunError(f"--workdir {workdir}: no {CONFIG_FILE} (not a run directory of "
                   "launch.py)")
  try:
    with open(path) as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise RunError(f"{path}: malformed JSON ({e})") from None
  return from_dict(ExperimentConfig, data)


# ----------------------------------------------------------------------------------------
# The saved policy.


@dataclasses.dataclass
class SavedPolicy:
  cfg: ExperimentConfig
  workdir: str
  step: str  # "sft" or the RL checkpoint's number
  tok: Any
  fmt: Any
  graphdef: Any
  params: Any
  mesh: Any

  def model(self):
    from flax import nnx  # pylint: disable=import-outside-toplevel
    return nnx.merge(self.graphdef, self.params)


def _policy_pieces(cfg: ExperimentConfig, workdir: str, mesh):
  """(tokenizer, prompt format, graphdef, initial params) as the trainer builds them."""
  from flax import nnx  # pylint: disable=import-outside-toplevel

  from csa_jax import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  from csa_jax import prompts  # pylint: disable=import-outside-toplevel
  from csa_jax.model import Decoder, hf  # pylint: disable=import-outside-toplevel
  from csa_jax.tokenizer import Tokenizer  # pylint: disable=import-outside-toplevel

  if cfg.model_path:
    try:
      model, tok = hf.from_pretrained(cfg.model_path, dtype=cfg.model.dtype,
                                      param_dtype=cfg.model.param_dtype, mesh=mesh,
                                      rules=mesh_lib.TRAIN_RULES,
                                      scan_layers=cfg.model.scan_layers)
    except (ValueError, FileNotFoundError) as e:
      raise RunError(f"model_path {cfg.model_path}: {str(e).splitlines()[0]}") from None
    fmt = (prompts.PromptFormat.chat(tok, cfg.rollout.action_format) if tok.chat_template
           else prompts.PromptFormat(action_prefix=" ",
                                     action_format=cfg.rollout.action_format))
  else:
    path = os.path.join(workdir, "tokenizer.json")
    if not os.path.isfile(path):
      raise RunError(f"--workdir {workdir}: no tokenizer.json (the run stopped before "
                     "SFT began)")
    tok = Tokenizer.load(path)
    fmt = prompts.PromptFormat(action_format=cfg.rollout.action_format)
    model = Decoder(cfg.model, rngs=nnx.Rngs(cfg.seed))
    mesh_lib.shard_model(model, mesh, mesh_lib.TRAIN_RULES)
  graphdef, params = nnx.split(model, nnx.Param)
  return tok, fmt, graphdef, params


def available_steps(workdir: str) -> tuple[list[int], bool]:
  """(RL checkpoint steps, whether an SFT checkpoint exists), without opening them."""
  ckpt = os.path.join(workdir, "checkpoints")
  steps = sorted(int(d) for d in os.listdir(ckpt) if d.isdigit()) if os.path.isdir(ckpt) else []
  from csa_jax.config import has_sft_checkpoint  # pylint: disable=import-outside-toplevel
  return steps, has_sft_checkpoint(workdir)


def load(workdir: str, step: str | None = None, overrides: list[str] | None = None,
         mesh: str | None = None) -> SavedPolicy:
  """The policy of `workdir` at `step` ("sft", an RL checkpoint number, or None: the
  newest RL checkpoint, else the SFT weights), with `overrides` applied to its config."""
  from csa_jax import algorithms  # pylint: disable=import-outside-toplevel
  from csa_jax import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  from csa_jax import train_step as ts  # pylint: disable=import-outside-toplevel
  from csa_jax.checkpoint import Checkpointer, CheckpointError  # pylint: disable=import-outside-toplevel
  from csa_jax.config import apply_overrides  # pylint: disable=import-outside-toplevel

  cfg = load_config(workdir)
  if mesh:
    cfg = dataclasses.replace(cfg, mesh=mesh)
  cfg = apply_overrides(cfg, list(overrides or []))
  steps, has_sft = available_steps(workdir)
  if step is None:
    step = str(steps[-1]) if steps else "sft"
  if step != "sft" and not (step.isdigit() and int(step) in steps):
    raise RunError(f"--step {step}: {workdir} has RL checkpoints "
                   f"{', '.join(map(str, steps)) or '(none)'}"
                   f"{' and sft' if has_sft else ''}")
  if step == "sft" and not has_sft:
    raise RunError(f"--workdir {workdir}: no checkpoint to load (no RL checkpoint and no "
                   "finished SFT stage)")
  try:
    m = mesh_lib.make_mesh(cfg.mesh)
  except ValueError as e:
    raise RunError(str(e)) from None
  tok, fmt, graphdef, params = _policy_pieces(cfg, workdir, m)
  try:
    if step == "sft":
      params, _ = Checkpointer(os.path.join(workdir, "sft"), max_to_keep=1).restore(params)
    else:
      # The tree the trainer saved (train state, and the method's auxiliary state).
      tx = ts.make_optimizer(cfg.optim)
      state = ts.init_state(params, tx)
      aux = algorithms.get(cfg.algo.method).init_aux(cfg, state.params)
      ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
      tree, _ = ckpt.restore(algorithms.pack_state(state, aux), int(step))
      params = algorithms.unpack_state(tree, aux)[0].params
  except CheckpointError as e:
    raise RunError(str(e)) from None
  return SavedPolicy(cfg, workdir, step, tok, fmt, graphdef, params, m)


def _sampler(saved: SavedPolicy, greedy: bool):
  """The evaluation sampler with the key the run's own evaluations used."""
  import jax  # pylint: disable=import-outside-toplevel

  from csa_jax import distributed as dist  # pylint: disable=import-outside-toplevel
  from csa_jax.policy import SamplerPolicy  # pylint: disable=import-outside-toplevel
  c = saved.cfg
  key = dist.process_key(jax.random.fold_in(jax.random.key(c.seed), 2 + greedy))
  return SamplerPolicy(saved.graphdef, lambda: saved.params, saved.tok, c, greedy=greedy,
                       key=key, mesh=saved.mesh, temperature=c.eval.temperature)


def _pool(cfg: ExperimentConfig, num_envs: int | None = None):
  from environments.pool import EnvPool  # pylint: disable=import-outside-toplevel
  return EnvPool(cfg.env.name, dict(cfg.env.kwargs), num_envs or cfg.rollout.num_envs,
                 backend=cfg.env.pool_backend, step_timeout_s=cfg.rollout.step_timeout_s)


# ----------------------------------------------------------------------------------------
# --eval


def evaluate(saved: SavedPolicy) -> dict[str, Any]:
  """Held-out evaluation (eval.num_episodes tasks of eval_split from eval.first_task),
  greedy and sampled as eval.greedy / eval.sampled say: metrics, and one record per
  episode as the run's own eval/episodes.jsonl holds them (metrics.episode_records, at
  step 0 for the SFT weights), so the two compare task by task."""
  from csa_jax import distributed as dist  # pylint: disable=import-outside-toplevel
  from csa_jax.evaluation import evaluate as trainer_evaluate  # pylint: disable=import-outside-toplevel
  c = saved.cfg
  step = 0 if saved.step == "sft" else int(saved.step)
  out: dict[str, Any] = {"step": saved.step, "split": c.env.eval_split,
                         "first_task": c.eval.first_task, "metrics": {}, "episodes": []}
  with _pool(c) as pool:
    for prefix, greedy, on in (("eval", True, c.eval.greedy),
                               ("eval_sampled", False, c.eval.sampled)):
      if not on:
        continue
      m, trajs = trainer_evaluate(pool, _sampler(saved, greedy), saved.tok, c,
                                  f"step {saved.step} ({prefix})", prefix, saved.fmt)
      out["metrics"] |= m
      # Every process's episodes, as the trainer writes them (dist.episode_records).
      out["episodes"] += dist.episode_records(trajs, step, prefix)
  return out


def eval_report(result: dict[str, Any]) -> str:
  modes = list(dict.fromkeys(r["policy"] for r in result["episodes"]))
  by_mode = {p: [r for r in result["episodes"] if r["policy"] == p] for p in modes}
  lines = [f"Held-out evaluation of checkpoint {result['step']}: "
           f"{result['split']} tasks {result['first_task']}.."
           f"{result['first_task'] + len(by_mode[modes[0]]) - 1}"]
  m = result["metrics"]
  for prefix, name in (("eval", "greedy"), ("eval_sampled", "sampled")):
    if f"{prefix}/success" in m:
      lines.append(f"  {name:8s} success {m[f'{prefix}/success']:.3f}  mean length "
                   f"{m[f'{prefix}/episode_len']:.2f}  invalid actions "
                   f"{m[f'{prefix}/invalid_action_frac']:.3f}  episodes "
                   f"{int(m[f'{prefix}/episodes'])}")
  lines.append("")
  lines.append("  task  " + "  ".join(f"{'greedy' if p == 'eval' else 'sampled':>16s}"
                                      for p in modes))
  for rows in zip(*by_mode.values()):
    cells = [f"{'won' if r['success'] else 'lost':>4s} {r['length']:3d} steps " for r in rows]
    lines.append(f"  {rows[0]['index']:4d}  " + "  ".join(f"{c:>16s}" for c in cells))
  return "\n".join(lines)


def write_eval(saved: SavedPolicy, result: dict[str, Any]) -> str:
  path = os.path.join(saved.workdir, "eval", f"step_{saved.step}.json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  return path


# ----------------------------------------------------------------------------------------
# --export-hf


def check_export_dir(path: str) -> None:
  from csa_jax.workdir import unwritable  # pylint: disable=import-outside-toplevel
  problem = unwritable(path, "--export-hf")
  if problem:
    raise RunError(problem)
  if os.path.isdir(path) and os.listdir(path):
    raise RunError(f"--export-hf {path} is not empty; choose a new directory")


def export_hf(saved: SavedPolicy, path: str) -> list[str]:
  """A Hugging Face directory transformers loads (`AutoModelForCausalLM` and
  `AutoTokenizer`): config.json and safetensors weights in the run's param_dtype, the
  tokenizer (the run's own, or model_path's files), and csa_jax.json with the prompt
  settings the policy was trained with."""
  from csa_jax.model import hf  # pylint: disable=import-outside-toplevel
  from csa_jax.tokenizer import EOS, HF_CONFIG, PAD  # pylint: disable=import-outside-toplevel
  check_export_dir(path)
  c = saved.cfg
  hf.save_pretrained(saved.model(), path)
  if c.model_path:
    for name in os.listdir(c.model_path):
      if name.startswith(("tokenizer", "special_tokens", "generation_config", "vocab",
                          "merges", "chat_template")):
        shutil.copy(os.path.join(c.model_path, name), path)
  else:
    saved.tok.save(path)
    with open(os.path.join(path, HF_CONFIG), "w") as f:
      json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS,
                 "pad_token": PAD, "model_max_length": c.model.max_seq_len}, f, indent=2)
  cfg_path = os.path.join(path, "config.json")
  with open(cfg_path) as f:
    hf_cfg = json.load(f)
  hf_cfg |= {"eos_token_id": saved.tok.eos_id, "pad_token_id": saved.tok.pad_id}
  with open(cfg_path, "w") as f:
    json.dump(hf_cfg, f, indent=2)
  with open(os.path.join(path, "csa_jax.json"), "w") as f:
    json.dump({"run": os.path.abspath(saved.workdir), "step": saved.step,
               "experiment": c.name, "env": {"name": c.env.name, "kwargs": dict(c.env.kwargs)},
               "rollout": {k: getattr(c.rollout, k) for k in (
                   "history_turns", "max_prompt_tokens", "max_action_tokens",
                   "action_format", "temperature")}}, f, indent=2)
  return sorted(os.listdir(path))


# ----------------------------------------------------------------------------------------
# --play


def play(saved: SavedPolicy, n: int, *, greedy: bool = True) -> list:
  """n held-out episodes (eval_split from eval.first_task), played by the policy."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  from csa_jax import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
  c = saved.cfg
  tasks = [(c.env.eval_split, c.eval.first_task + i) for i in range(n)]
  with _pool(c, min(n, c.rollout.num_envs)) as pool:
    return rollout_lib.run_episodes(pool, _sampler(saved, greedy), saved.tok, tasks,
                                    c.rollout, np.random.default_rng(0), fmt=saved.fmt)


def format_episode(traj, tok, *, greedy: bool) -> str:
  """An episode as the policy saw it: its first prompt whole, then each step's new
  observation and the action it took."""
  split, index = traj.task
  out = [f"=== {'greedy' if greedy else 'sampled'} episode, {split} task {index}"]
  for t, s in enumerate(traj.steps):
    if t == 0:
      out.append("PROMPT (as the policy saw it):")
      out.append(textwrap.indent(tok.decode(s.prompt_ids).strip(), "  | "))
    else:
      out.append(textwrap.indent(s.observation.strip(), "    "))
    flags = "" if s.valid else "  (invalid)"
    out.append(f"  > {s.action}   reward={s.reward:+.3f}{flags}")
  end = ("won" if traj.won else "truncated" if traj.truncated else
         f"error: {traj.error}" if traj.error else "lost")
  out.append(f"--- {end} after {traj.length} steps\n")
  return "\n".join(out)
