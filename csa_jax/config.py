"""Frozen, typed experiment configs and `--set key=value` overrides.

Style after big_vision / Levanter: an experiment is a tree of frozen dataclasses built
by a Python function; the command line may only replace existing leaves, with values
parsed to the leaf's declared type. Anything else is a `ConfigError` whose message names
the bad key or value and what is valid.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from typing import Any, Mapping

from csa_jax import config_fields
from csa_jax.algo_config import AlgoConfig
from csa_jax.workdir import has_sft_checkpoint
from csa_jax.model import ModelConfig


class ConfigError(ValueError):
  """A config key or value that is not valid; the message says what is."""


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """Which registered environment, and the keyword arguments for `make_env`."""

  name: str = "twx"
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  train_split: str = "train"
  eval_split: str = "test"
  # Task indices used for training are 0 .. num_train_tasks-1 of train_split.
  num_train_tasks: int = 1000
  # "thread" for JVM-backed engines (TextWorldExpress, ScienceWorld), "process" for
  # engines whose work is Python (ALFWorld).
  pool_backend: str = "thread"


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
  # Size of the byte-level BPE trained on the expert demonstrations' text, for policies
  # trained from scratch (a pretrained `model_path` brings its own tokenizer).
  vocab_size: int = 1024


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  tasks_per_iter: int = 4  # B
  group_size: int = 8  # G
  max_turns: int = 12  # T
  history_turns: int = 2
  max_prompt_tokens: int = 192
  max_action_tokens: int = 8
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  num_envs: int = 32
  step_timeout_s: float = 60.0
  # logp of a step = sum (or mean) over its action tokens, recorded at sampling time.
  logp_reduce: str = "sum"
  # GiGPO's anchor state: "state" is what the environment says identifies the state (each
  # adapter documents it: room, inventory and score in TextWorldExpress; the PDDL state in
  # ALFWorld); "faithful" is the observation text, as verl-agent keys it, which merges
  # states whose feedback reads alike ("Nothing happens." after any invalid action).
  anchor: str = "state"
  # "bare": the answer is the action. "think": reasoning, then the action inside
  # <action>...</action> (verl-agent's format; csa_jax/rollout/prompts.py, `parse_action`);
  # max_action_tokens then budgets the reasoning too.
  action_format: str = "bare"
  # A chat model's system message before each prompt (empty: the chat template's default,
  # if it writes one). Every prompt token costs compute at every step: keep it short.
  system_prompt: str = ""
  # Prompt rows per prefill pass of the sampler (0: all num_envs at once): a long prompt's
  # attention scores are what a big model's sampling runs out of memory on.
  prefill_chunk: int = 0
  # Overlap environment steps with sampling: the wave's slots play in two halves, and the
  # host steps one half's environments while the device samples for the other
  # (csa_jax/rollout/episodes.py, `_play_overlapped`). Episodes follow the same rules; the sampler's
  # key stream is split into twice as many calls of half the rows, so a seed draws other
  # actions than with overlap off. Pays where environment steps are slow (ALFWorld,
  # ScienceWorld); benchmarks/iteration.py measures it.
  overlap: bool = False
  # The shapes the sampler runs a call's live prompts in. "bucket": all of them in one
  # batch, the rows rounded up to a quarter, a half or all of num_envs and the width to a
  # power of two (at most the prompt budget). "fit": grouped by length into up to three
  # batches where that saves work, each batch's rows and width rounded up to one of 8
  # evenly spaced sizes per doubling (at most 1/8 padding; policy.fit_groups); a run
  # compiles more shapes, and its key stream is split per batch, so a seed draws other
  # actions than with "bucket".
  sampler_shapes: str = "bucket"
  # The prefix every prompt of a sampler call starts with (the chat header and system
  # message, the task line of one group) goes through the model once and its cache is
  # copied to every row (sampling.sample's share_prefix): the same samples up to float
  # rounding, less prefill work.
  share_prefix: bool = False

  @property
  def seq_len(self) -> int:
    """The longest sequence a step makes: its prompt and its action, each at its budget
    (a training row's length; at most model.max_seq_len)."""
    return self.max_prompt_tokens + self.max_action_tokens


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  learning_rate: float = 3e-4
  warmup_steps: int = 0
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  b1: float = 0.9
  b2: float = 0.99
  # AdamW's first-moment dtype ("": the parameters'; "bfloat16" halves it).
  mu_dtype: str = ""
  # Rows per forward/backward pass inside one update (gradient accumulation over
  # batch / micro_batch_size slices; csa_jax/update/train_step.py, `value_and_grad_micro`): what
  # lets long rows of a big model fit. 0: the whole batch in one pass.
  micro_batch_size: int = 0
  # Pack training rows into fixed-length sequences (first-fit, attention kept within each
  # row; csa_jax/update/data.py, `packed_batches`) instead of padding each row to the prompt +
  # action budget. A minibatch holds the same rows either way (algo.minibatch_size rows,
  # sft.batch_size for SFT), so the loss and the optimizer steps are the same; only the
  # padding, hence the compute, shrinks. A batch takes the sequences its rows need, rounded
  # up to one of 8 counts per doubling (data.round_up_count), so a run compiles one update
  # shape per count it meets (a handful), not one.
  pack_rows: bool = True
  # Compute the prompt tokens every training row of a call starts with (the chat markup and
  # system message) once per micro-batch instead of once per row: an unpacked minibatch is
  # laid out with them split off (csa_jax/update/data.py, `prefixed`) and every row
  # attends to their keys/values (Decoder.hidden_states_prefixed). The same loss up to
  # float rounding, for fewer tokens through the model. Only where rows go through
  # `packed_batches` (pack_rows, one process) and a minibatch is laid out unpacked.
  share_prefix: bool = False
  # An update whose loss or gradient is not finite is skipped (parameters and optimizer
  # state unchanged); this many skipped in a row stop the run (0: never stop).
  max_nonfinite_in_a_row: int = 3


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  num_demos: int = 100
  # Where the expert demonstrations are built (TFDS array_record, keyed by environment
  # config and task count). Shared by default ($CSA_JAX_CACHE/demos, else
  # ~/.cache/csa_jax/demos) so that every algorithm run on one environment clones the
  # same demonstrations, as the proposal's common SFT start requires.
  demos_dir: str = ""
  epochs: int = 4
  batch_size: int = 64
  learning_rate: float = 1e-3
  # A run directory whose SFT stage to start from (its tokenizer.json and sft/
  # checkpoint) instead of cloning the demonstrations again: a sweep's methods of one
  # seed all start from the same weights this way. Empty: run SFT here.
  init_from: str = ""
  # Which expert episodes are cloned: "won" (the default: a successful demonstrator) or
  # "all" (every episode, lost ones too: cloning a noisy demonstrator, whose mistakes the
  # SFT policy then makes about as often, as on the delayed-credit testbed
  # experiments/keydoor.py).
  demo_filter: str = "won"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  num_episodes: int = 100
  # Held-out tasks are eval_split's indices first_task .. first_task + num_episodes - 1.
  # When eval_split is the training split, they must lie past env.num_train_tasks (tasks
  # RL never samples and demonstrations never cover).
  first_task: int = 0
  # Greedy actions, and (also) actions sampled at the rollout temperature.
  greedy: bool = True
  sampled: bool = True
  # Evaluate every this many RL iterations (0: only before and after RL).
  every: int = 0
  # Held-out tasks of those intermediate evaluations (the first N of the final one's; 0:
  # num_episodes), and whether they run greedy too (else only the sampled evaluation, the
  # policy RL optimises, as a learning curve needs).
  every_episodes: int = 0
  every_greedy: bool = True
  # Also at every evaluation: the exact probability, under the sampled evaluation's
  # distribution, that the policy writes the environment's oracle action at each held-out
  # task's first step (environments with `oracle_action`, e.g. KeyDoor's right key): the
  # decisive choice's success without sampling noise (eval/oracle_probs.jsonl per task).
  oracle_prob: bool = False
  # Temperature of the sampled evaluation ("eval_sampled/"); 0: the rollout temperature
  # (the policy RL optimises). verl-agent validates at 0.4.
  temperature: float = 0.0


@dataclasses.dataclass(frozen=True)
class LogConfig:
  """Where a run's metrics go besides metrics.jsonl and TensorBoard (csa_jax/run/loggers.py)."""

  # Weights & Biases: every metrics line also becomes a row of a W&B run in the work
  # directory (wandb/), named after the experiment. WANDB_MODE=offline keeps it on disk
  # (`wandb sync` uploads it later); online needs a login (WANDB_API_KEY).
  wandb: bool = False
  wandb_project: str = "csa-jax"


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  name: str = "unnamed"
  seed: int = 0
  mesh: str = "1x1"
  env: EnvConfig = EnvConfig()
  tokenizer: TokenizerConfig = TokenizerConfig()
  # A local Hugging Face directory (Llama 3.x / Qwen2.x): the policy starts from it; its
  # shape replaces `model`'s when the run's config is resolved (csa_jax/pretrained.py), and
  # `model` keeps the dtypes, remat, scanned layers and LoRA. Empty: a decoder of `model`'s
  # shape trained from scratch.
  model_path: str = ""
  # The pretrained checkpoint the experiment is for (e.g. "meta-llama/Llama-3.1-8B-Instruct"):
  # such a run needs `model_path` pointing at a local copy of it (`--dry-run` does not),
  # unless it is packaged with the project (csa_jax/pretrained.py, PACKAGED:
  # "HuggingFaceTB/SmolLM2-135M-Instruct"), which is imported into the cache on first use.
  # Empty: any policy, from scratch or `model_path`.
  pretrained: str = ""
  # Where model_path's weights came from (its path, sha256s, the GGUF file it was imported
  # from), recorded when the config is resolved against it (csa_jax/pretrained.py); from
  # then on the length checks apply to `model`. Empty: not resolved, or from scratch.
  model_origin: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig.tiny(vocab_size=1024))
  rollout: RolloutConfig = RolloutConfig()
  algo: AlgoConfig = AlgoConfig()
  optim: OptimConfig = OptimConfig()
  sft: SFTConfig = SFTConfig()
  eval: EvalConfig = EvalConfig()
  rl_iterations: int = 20
  # The RL budget in environment steps (the proposal's 10,000 "online rollout steps"):
  # RL ends after the iteration that reaches it, or at rl_iterations. 0: no step budget.
  rl_env_steps: int = 0
  checkpoint_every: int = 5
  log_every: int = 1
  log: LogConfig = LogConfig()
  # Device memory in GiB that `launch.py --dry-run` checks the plan against (0: the
  # device's own limit where it reports one).
  device_memory_gb: float = 0.0


# ----------------------------------------------------------------------------------------
# Overrides.


def _leaf_type(cls: type, name: str) -> Any:
  return typing.get_type_hints(cls)[name]


def _parse(text: str, typ: Any, key: str) -> Any:
  """Parses `text` as a value of the declared type `typ`."""
  origin = typing.get_origin(typ)
  args = typing.get_args(typ)
  if origin in (typing.Union, types.UnionType):
    errors = []
    if type(None) in args and text.lower() in ("none", "null"):
      return None
    for a in args:
      if a is type(None):
        continue
      try:
        return _parse(text, a, key)
      except ConfigError as e:
        errors.append(str(e))
    raise ConfigError(errors[0])
  if typ is bool:
    if text.lower() in ("1", "true", "yes", "on"):
      return True
    if text.lower() in ("0", "false", "no", "off"):
      return False
    raise ConfigError(f"--set {key}={text}: expected a bool (true/false)")
  if typ in (int, float):
    try:
      value = typ(text)
    except ValueError:
      raise ConfigError(f"--set {key}={text}: expected {typ.__name__}") from None
    return value
  if typ is str:
    return text
  if origin is tuple:
    parts = [p for p in text.split(",") if p] if text else []
    inner = args[0] if args else str
    return tuple(_parse(p, inner, key) for p in parts)
  raise ConfigError(f"--set {key}: cannot override a field of type {typ}")


def _parse_free(text: str) -> Any:
  """A value for an untyped mapping entry (env kwargs): JSON if it parses, else text."""
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def override(cfg: Any, key: str, text: str, _prefix: str = "") -> Any:
  """Returns `cfg` with the leaf at dotted `key` replaced by `text` parsed to its type."""
  head, _, rest = key.partition(".")
  full = _prefix + head
  if isinstance(cfg, Mapping):
    if rest:
      raise ConfigError(f"--set {full}.{rest}: {full} is a plain value")
    new = dict(cfg)
    new[head] = _parse_free(text)
    return new
  fields = {f.name: f for f in dataclasses.fields(cfg)}
  if head not in fields:
    raise ConfigError(
        f"unknown config key {full!r}; valid keys here: {', '.join(sorted(fields))}")
  current = getattr(cfg, head)
  if rest:
    if not (dataclasses.is_dataclass(current) or isinstance(current, Mapping)):
      raise ConfigError(f"--set {full}.{rest}: {full} is a plain value, not a section")
    value = override(current, rest, text, _prefix=full + ".")
  else:
    if dataclasses.is_dataclass(current) or isinstance(current, Mapping):
      sub = [f.name for f in dataclasses.fields(current)] if dataclasses.is_dataclass(
          current) else list(current)
      raise ConfigError(f"--set {full}: a section; set one of {full}.{{{', '.join(sub)}}}")
    value = _parse(text, _leaf_type(type(cfg), head), full)
  try:
    return dataclasses.replace(cfg, **{head: value})
  except (ValueError, TypeError) as e:
    raise ConfigError(f"--set {full}={text}: {e}") from None


def apply_overrides(cfg: ExperimentConfig, pairs: list[str]) -> ExperimentConfig:
  for pair in pairs:
    if "=" not in pair:
      raise ConfigError(f"--set expects key=value, got {pair!r}")
    key, text = pair.split("=", 1)
    cfg = override(cfg, key.strip(), text.strip())
  return validate(cfg)


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
  """Every leaf's type and range (csa_jax/config_fields.py, the one place for a rule on
  one field), then the checks that no single field can make: rules across fields, and
  paths that must exist."""
  problem = config_fields.first_problem(cfg)
  if problem:
    raise ConfigError(problem)
  r, a = cfg.rollout, cfg.algo
  # `model` is a pretrained checkpoint's shape only once the config is resolved.
  shape_unknown = bool(cfg.model_path) and not cfg.model_origin
  checks = [
      (not r.prefill_chunk or sampler_rows(r) % r.prefill_chunk == 0,
       f"rollout.prefill_chunk={r.prefill_chunk} must divide the sampler's rows per call "
       f"({sampler_rows(r)}: rollout.num_envs, halved rounding up with rollout.overlap) "
       "(0: off)"),
      (shape_unknown or r.seq_len <= cfg.model.max_seq_len,
       f"rollout.max_prompt_tokens + rollout.max_action_tokens = "
       f"{r.seq_len} exceeds model.max_seq_len "
       f"{cfg.model.max_seq_len}"),
      # Narrower than the two fields' ranges (config_fields.py: what the sampler accepts):
      # RL's importance ratio needs the untruncated distribution.
      (r.top_k == 0 and r.top_p == 1.0,
       "rollout.top_k/top_p truncate the sampling distribution, so a token the updated "
       "policy no longer keeps gets ratio 0/inf; use temperature only for RL rollouts"),
      (cfg.model_path or cfg.tokenizer.vocab_size <= cfg.model.vocab_size,
       f"tokenizer.vocab_size={cfg.tokenizer.vocab_size} exceeds model.vocab_size="
       f"{cfg.model.vocab_size} (the embedding must hold every token)"),
      (not cfg.model_path or os.path.isdir(cfg.model_path),
       f"model_path {cfg.model_path!r} is not a directory (a local Hugging Face checkpoint)"),
      (a.method != "mtdpo" or not (a.kl_coef or a.entropy_coef),
       "algo.method=mtdpo trains the DPO loss alone (its beta is the KL anchor): set "
       "algo.kl_coef=0 and algo.entropy_coef=0"),
      (not cfg.sft.init_from or has_sft_checkpoint(cfg.sft.init_from),
       f"sft.init_from {cfg.sft.init_from!r} holds no SFT checkpoint (expected "
       f"{os.path.join(cfg.sft.init_from, 'sft')}, written by a run's SFT stage)"),
      (all(not cfg.optim.micro_batch_size or n % cfg.optim.micro_batch_size == 0
           for n in (a.minibatch_size, cfg.sft.batch_size)),
       f"optim.micro_batch_size={cfg.optim.micro_batch_size} must divide algo.minibatch_size "
       f"({a.minibatch_size}) and sft.batch_size ({cfg.sft.batch_size}) (0: off)"),
      (cfg.env.eval_split != cfg.env.train_split
       or cfg.eval.first_task >= max(cfg.env.num_train_tasks, cfg.sft.num_demos),
       f"eval.first_task={cfg.eval.first_task} would evaluate on training tasks: with "
       f"eval_split == train_split it must be >= env.num_train_tasks "
       f"({cfg.env.num_train_tasks}) and sft.num_demos"),
      (cfg.eval.greedy or cfg.eval.sampled, "eval.greedy and eval.sampled are both off"),
      (cfg.eval.every_episodes <= cfg.eval.num_episodes,
       f"eval.every_episodes={cfg.eval.every_episodes} exceeds eval.num_episodes="
       f"{cfg.eval.num_episodes} (an intermediate evaluation takes the first of its tasks)"),
      (cfg.eval.every_greedy or cfg.eval.sampled or not cfg.eval.every,
       "eval.every_greedy=false with eval.sampled=false leaves the intermediate "
       "evaluations nothing to run"),
  ]
  for ok, msg in checks:
    if not ok:
      raise ConfigError(msg)
  return cfg


def sampler_rows(r: RolloutConfig) -> int:
  """Prompts per sampler call: every env slot, or one half of them with overlap."""
  return -(-r.num_envs // 2) if r.overlap and r.num_envs >= 2 else r.num_envs


def micro_batches(optim: "OptimConfig", batch_size: int) -> int:
  """How many slices an update of `batch_size` rows is computed in."""
  return batch_size // optim.micro_batch_size if optim.micro_batch_size else 1


def cache_dir(*parts: str) -> str:
  """$CSA_JAX_CACHE (default ~/.cache/csa_jax), or a folder in it: what runs build once and
  share (demonstrations, imported models)."""
  root = os.environ.get("CSA_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "csa_jax"))
  return os.path.join(root, *parts)


def demos_dir(cfg: ExperimentConfig) -> str:
  return cfg.sft.demos_dir or cache_dir("demos")


def to_dict(cfg: Any) -> dict[str, Any]:
  """A JSON-ready view of a config tree."""
  return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


# Keys of a run's config.json that are records of the run, not config.
RECORDS = ("provenance",)


def from_dict(cls: type, data: Mapping[str, Any], source: str = "config",
              _prefix: str = "") -> Any:
  """The config dataclass `cls` back from its `to_dict` form (a run's config.json, or one
  section of it): keys the code no longer has are refused (a config from other code),
  missing ones take their defaults. `source` names the file in messages."""
  if not isinstance(data, Mapping):
    raise ConfigError(f"{source}: {_prefix.rstrip('.') or 'config'} should be a section, "
                      f"got {data!r}")
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - names - (set(RECORDS) if cls is ExperimentConfig else set()))
  if unknown:
    raise ConfigError(f"{source}: unknown config key {_prefix + unknown[0]!r} (written by "
                      "another version of csa-jax?)")
  kwargs = {k: _from_value(hints[k], v, source, _prefix + k) for k, v in data.items()
            if k in names}
  try:
    return cls(**kwargs)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{source}: {_prefix.rstrip('.') or 'config'}: {e}") from None


def _from_value(typ: Any, value: Any, source: str, key: str) -> Any:
  origin, args = typing.get_origin(typ), typing.get_args(typ)
  if origin in (typing.Union, types.UnionType):
    if value is None:
      return None
    inner = [a for a in args if a is not type(None)]
    return _from_value(inner[0], value, source, key) if len(inner) == 1 else value
  if dataclasses.is_dataclass(typ):
    return from_dict(typ, value, source, key + ".")
  if origin is tuple:
    return tuple(value)
  if typ is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value
