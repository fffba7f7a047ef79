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
from typing import Any

from csa_jax import workdir as workdir_lib
from csa_jax.config import ConfigError, ExperimentConfig, from_dict

CONFIG_FILE = "config.json"


class RunError(ConfigError):
  """A run directory, step or export target that cannot be used (one line says why)."""


# ----------------------------------------------------------------------------------------
# config.json -> ExperimentConfig.


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
  return from_dict(ExperimentConfig, data, source=CONFIG_FILE)


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


def _saved_tokenizer(workdir: str):
  """The tokenizer a from-scratch run saved (`build_policy`'s `tokenizer`)."""
  from csa_jax.model.tokenizer import Tokenizer  # pylint: disable=import-outside-toplevel

  def read(fmt):
    del fmt  # the run's own ids, whatever it was trained on
    path = os.path.join(workdir, "tokenizer.json")
    if not os.path.isfile(path):
      raise RunError(f"--workdir {workdir}: no tokenizer.json (the run stopped before "
                     "SFT began)")
    return Tokenizer.load(path)

  return read


def _mesh(cfg: ExperimentConfig):
  """cfg.mesh built, or one line for a mesh that does not fit the devices."""
  from csa_jax.distributed import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  try:
    return mesh_lib.make_mesh(cfg.mesh)
  except ValueError as e:
    raise RunError(str(e)) from None


def load(workdir: str, step: str | None = None, overrides: list[str] | None = None,
         mesh: str | None = None) -> SavedPolicy:
  """The policy of `workdir` at `step` ("sft", an RL checkpoint number, or None: the
  newest RL checkpoint, else the SFT weights), with `overrides` applied to its config."""
  from csa_jax import algorithms  # pylint: disable=import-outside-toplevel
  from csa_jax.config import apply_overrides  # pylint: disable=import-outside-toplevel
  from csa_jax.rollout.policy import build_policy  # pylint: disable=import-outside-toplevel
  from csa_jax.run.checkpoint import Checkpointer, CheckpointError  # pylint: disable=import-outside-toplevel
  from csa_jax.update import train_step as ts  # pylint: disable=import-outside-toplevel

  cfg = load_config(workdir)
  if mesh:
    cfg = dataclasses.replace(cfg, mesh=mesh)
  cfg = apply_overrides(cfg, list(overrides or []))
  steps, has_sft = workdir_lib.rl_steps(workdir), workdir_lib.has_sft_checkpoint(workdir)
  if step is None:
    step = str(steps[-1]) if steps else "sft"
  if step != "sft" and not (step.isdigit() and int(step) in steps):
    raise RunError(f"--step {step}: {workdir} has RL checkpoints "
                   f"{', '.join(map(str, steps)) or '(none)'}"
                   f"{' and sft' if has_sft else ''}")
  if step == "sft" and not has_sft:
    raise RunError(f"--workdir {workdir}: no checkpoint to load (no RL checkpoint and no "
                   "finished SFT stage)")
  m = _mesh(cfg)
  tok, fmt, graphdef, params = build_policy(cfg, m, _saved_tokenizer(workdir))
  try:
    if step == "sft":
      params, _ = Checkpointer(os.path.join(workdir, workdir_lib.SFT),
                               max_to_keep=1).restore(params)
    else:
      # The tree the trainer saved (train state, and the method's auxiliary state).
      tx = ts.make_optimizer(cfg.optim)
      state = ts.init_state(params, tx)
      aux = algorithms.get(cfg.algo.method).init_aux(cfg, state.params)
      ckpt = Checkpointer(os.path.join(workdir, workdir_lib.CHECKPOINTS))
      tree, _ = ckpt.restore(algorithms.pack_state(state, aux), int(step))
      params = algorithms.unpack_state(tree, aux)[0].params
  except CheckpointError as e:
    raise RunError(str(e)) from None
  return SavedPolicy(cfg, workdir, step, tok, fmt, graphdef, params, m)


def load_prompted(cfg: ExperimentConfig, workdir: str) -> SavedPolicy:
  """The pretrained model of `cfg` (a resolved config with a model_path) as it is, with no
  training: the prompted baseline, evaluated like a run's checkpoints (`evaluate`)."""
  from csa_jax.rollout.policy import build_policy  # pylint: disable=import-outside-toplevel
  if not cfg.model_path:
    raise RunError(f"--prompted evaluates a pretrained model, and {cfg.name} trains one from "
                   "scratch: --set model_path=DIR, or an experiment with a pretrained model "
                   "(`--list` shows them)")
  m = _mesh(cfg)
  tok, fmt, graphdef, params = build_policy(cfg, m, tokenizer=None)  # model_path's own
  return SavedPolicy(cfg, workdir, "prompted", tok, fmt, graphdef, params, m)


def write_prompted(saved: SavedPolicy, result: dict[str, Any]) -> list[str]:
  """The prompted baseline's files, read the way a run's evaluation is: config.json,
  metrics.jsonl (its rates at step 0, where a run has its SFT evaluation),
  eval/episodes.jsonl (one record per episode) and eval/step_prompted.json."""
  from csa_jax import provenance  # pylint: disable=import-outside-toplevel
  from csa_jax.config import to_dict  # pylint: disable=import-outside-toplevel
  from csa_jax.run import loggers  # pylint: disable=import-outside-toplevel
  os.makedirs(saved.workdir, exist_ok=True)
  with open(os.path.join(saved.workdir, CONFIG_FILE), "w") as f:
    json.dump(to_dict(saved.cfg) | {"provenance": provenance.record() | {
        "policy": "prompted: the pretrained model, no training"}}, f, indent=2)
  writer = loggers.MetricsWriter(saved.workdir, tensorboard=False)
  try:
    writer.keep(lambda r: False)  # an earlier evaluation of this directory is replaced
    writer.write(0, result["metrics"] | {"perf/env_steps_total": 0})
    writer.episodes(result["episodes"])
  finally:
    writer.close()
  return [os.path.join(saved.workdir, CONFIG_FILE), writer.path, writer.episodes_path,
          write_eval(saved, result)]


def _sampler(saved: SavedPolicy, greedy: bool):
  """The evaluation sampler with the key the run's own evaluations used."""
  import jax  # pylint: disable=import-outside-toplevel

  from csa_jax.distributed import processes as dist  # pylint: disable=import-outside-toplevel
  from csa_jax.rollout.policy import SamplerPolicy  # pylint: disable=import-outside-toplevel
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
  from csa_jax.rollout import metrics as metrics_lib  # pylint: disable=import-outside-toplevel
  from csa_jax.rollout.evaluation import evaluate as trainer_evaluate  # pylint: disable=import-outside-toplevel
  c = saved.cfg
  step = 0 if saved.step in ("sft", "prompted") else int(saved.step)
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
      # Every process's episodes, as the trainer writes them (metrics.gathered_episode_records).
      out["episodes"] += metrics_lib.gathered_episode_records(trajs, step, prefix)
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


ADAPTER_DIR = "adapter"


def check_export_dir(path: str) -> None:
  from csa_jax.workdir import unwritable  # pylint: disable=import-outside-toplevel
  problem = unwritable(path, "--export-hf")
  if problem:
    raise RunError(problem)
  if os.path.isdir(path) and os.listdir(path):
    raise RunError(f"--export-hf {path} is not empty; choose a new directory")


def export_hf(saved: SavedPolicy, path: str) -> list[str]:
  """A Hugging Face directory transformers loads (`AutoModelForCausalLM` and
  `AutoTokenizer`): config.json and safetensors weights in the run's param_dtype (a LoRA
  policy merged into its base), the tokenizer (the run's own, or model_path's files), and
  csa_jax.json with the prompt settings the policy was trained with. A LoRA policy's
  adapters alone go to `ADAPTER_DIR` inside it, in the PEFT format (`peft.PeftModel`
  loads them onto model_path's base); apart, because transformers, finding an
  adapter_config.json beside config.json, would load the adapters onto that base instead
  of reading the merged weights."""
  from csa_jax.model import hf  # pylint: disable=import-outside-toplevel
  from csa_jax.model.tokenizer import EOS, HF_CONFIG, PAD  # pylint: disable=import-outside-toplevel
  check_export_dir(path)
  c = saved.cfg
  model = saved.model()
  hf.save_pretrained(model, path)
  if c.model.lora.enabled:
    hf.save_peft(model, os.path.join(path, ADAPTER_DIR),
                 base_model_name_or_path=os.path.abspath(c.model_path) if c.model_path else "")
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
  record = {"run": os.path.abspath(saved.workdir), "step": saved.step,
            "experiment": c.name, "env": {"name": c.env.name, "kwargs": dict(c.env.kwargs)},
            "rollout": {k: getattr(c.rollout, k) for k in (
                "history_turns", "max_prompt_tokens", "max_action_tokens",
                "action_format", "temperature")}}
  if c.model.lora.enabled:  # a from-scratch base exists nowhere but in these merged weights
    record["adapter"] = {"dir": ADAPTER_DIR, "base": (os.path.abspath(c.model_path)
                                                      if c.model_path else
                                                      f"from scratch, seed {c.seed} (not saved)")}
  with open(os.path.join(path, "csa_jax.json"), "w") as f:
    json.dump(record, f, indent=2)
  return sorted(os.listdir(path))


# ----------------------------------------------------------------------------------------
# --play


def play(saved: SavedPolicy, n: int, *, greedy: bool = True) -> list:
  """n held-out episodes (eval_split from eval.first_task), played by the policy."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  from csa_jax.rollout import episodes as rollout_lib  # pylint: disable=import-outside-toplevel
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
