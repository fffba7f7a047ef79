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
  # <action>...</action> (verl-agent's format; csa_jax/rollout.py, `parse_action`);
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
  # (csa_jax/rollout.py, `_play_overlapped`). Episodes follow the same rules; the sampler's
  # key stream is split into twice as many calls of half the rows, so a seed draws other
  # actions than with overlap off. Pays where environment steps are slow (ALFWorld,
  # ScienceWorld); benchmarks/iteration.py measures it.
  overlap: bool = False


@dataclasses.dataclass(frozen=True)
class IStarConfig:
  """iStar (csa_jax/algorithms/istar.py): the implicit PRM and its optimizer."""

  beta: float = 0.05  # r_t = beta * (log pi_prm(a_t) - log pi_old(a_t))
  alpha: float = 1.0  # weight of the step term in A = A_E + alpha * A_S
  # The authors' PRM learning rate is twice the policy's (1e-6 vs 5e-7); this default is
  # twice the quickstart's policy rate.
  learning_rate: float = 2e-4
  grad_clip: float = 10.0
  # Rows per PRM forward/backward batch; whole task groups are packed into a batch, so
  # it is raised to group_size * max_turns where that is larger.
  batch_rows: int = 128


@dataclasses.dataclass(frozen=True)
class SPAConfig:
  """SPA-RL (csa_jax/algorithms/spa.py): exploration and the progress estimator."""

  # Exploration after SFT: explore_k rollouts (at rollout.temperature) on each of the
  # first explore_tasks training tasks.
  explore_tasks: int = 100
  explore_k: int = 5
  # With an `rl_env_steps` budget, exploration stops after the chunk (one wave of the
  # environment pool) in which its environment steps reach this share of the budget:
  # they count against the budget like the RL rollouts' steps, so RL gets the rest.
  explore_share: float = 0.25
  learning_rate: float = 1e-4
  grad_clip: float = 1.0
  epochs: int = 4
  # Rows per estimator batch; whole episodes are packed into a batch (raised to
  # max_turns where that is larger).
  batch_rows: int = 128
  # Step reward r_t = progress_coef * c_t + the grounding term: "penalty" (the default)
  # pays -grounding for an action the environment rejected and 0 for an executed one;
  # "bonus" (the paper's literal form) pays +grounding for an executed one and 0 for a
  # rejected one. Both have the same contrast between executed and rejected actions;
  # "bonus" adds a constant +grounding to every step, whose discounted sum pays for
  # episode length (issue 26: it made every coin_doors seed worse; spa.py).
  progress_coef: float = 1.0
  grounding: float = 0.5
  grounding_mode: str = "penalty"
  gamma: float = 0.99


@dataclasses.dataclass(frozen=True)
class MDPOConfig:
  """Multi-turn DPO (csa_jax/algorithms/mtdpo.py)."""

  beta: float = 0.1
  # The reference policy: "sft" (the SFT weights) or "previous" (the policy at the start
  # of each iteration, the online iterative variant).
  reference: str = "sft"


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
  # What drives an RL iteration (csa_jax/algorithms): "estimator" (advantages from the
  # `estimator` below, then the clipped update), "istar", "spa" or "mtdpo".
  method: str = "estimator"
  estimator: str = "csa"
  lam: float = 0.5
  gamma: float = 0.95
  w: float = 1.0
  eps: float = 1e-6
  # Delta degrees of freedom of the estimators' stds (1: unbiased, as torch.std in GRPO).
  ddof: int = 1
  std_normalize: bool = True
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float = 0.0  # 0 disables; DAPO/verl use 3.0
  loss_agg: str = "token-mean"
  # KL to the SFT policy (k3, GRPO's estimator). On by default: without it the tiny CPU
  # policies drifted (more invalid actions, lower held-out success; docs/methods.md, "What makes
  # RL learn here"). DAPO and Dr.GRPO drop it in their papers; here every method keeps
  # the same anchor so that methods differ only in their advantages and losses.
  kl_coef: float = 0.05
  kl_kind: str = "k3"
  # The KL reference's storage dtype ("": the parameters'; "bfloat16": half a float32 copy,
  # the same logits under bfloat16 compute). A LoRA policy's reference is its SFT adapters
  # over the shared base, never a copy (csa_jax/model/lora.py).
  ref_dtype: str = ""
  entropy_coef: float = 0.0
  # DAPO dynamic sampling: drop groups whose rewards are all equal.
  dynamic_sampling: bool = False
  # At most this many rounds of B groups are played per iteration to fill the batch.
  dynamic_sampling_rounds: int = 3
  # DAPO overlong reward shaping: a linear penalty (up to -overlong_factor) for actions
  # whose length falls in the last `overlong_cache_frac` of the limit; "step" judges each
  # action against rollout.max_action_tokens, "episode" the episode's total against
  # max_action_tokens * max_turns. 0 disables it.
  overlong_cache_frac: float = 0.0
  overlong_factor: float = 1.0
  overlong_per: str = "step"
  # verl-agent's invalid-action penalty: every step the environment rejected costs this
  # much reward (the episode's return falls by it, and the step's own reward for
  # step-reward estimators such as GiGPO). 0 disables it.
  invalid_penalty: float = 0.1
  # How much each agent step (one training row) weighs: "step" (every row alike, so a
  # 15-step failure weighs 3-5x a short success) or "episode" (each episode's rows share
  # one episode's weight: the advantage of a row is scaled by mean_len / its episode's len).
  row_weight: str = "episode"
  epochs: int = 1
  minibatch_size: int = 64
  istar: IStarConfig = IStarConfig()
  spa: SPAConfig = SPAConfig()
  mtdpo: MDPOConfig = MDPOConfig()


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
  # batch / micro_batch_size slices; csa_jax/train_step.py, `value_and_grad_micro`): what
  # lets long rows of a big model fit. 0: the whole batch in one pass.
  micro_batch_size: int = 0
  # Pack training rows into fixed-length sequences (first-fit, attention kept within each
  # row; csa_jax/data.py, `packed_batches`) instead of padding each row to the prompt +
  # action budget. A minibatch holds the same rows either way (algo.minibatch_size rows,
  # sft.batch_size for SFT), so the loss and the optimizer steps are the same; only the
  # padding, hence the compute, shrinks. A batch takes the sequences its rows need, rounded
  # up to one of 8 counts per doubling (data.round_up_count), so a run compiles one update
  # shape per count it meets (a handful), not one.
  pack_rows: bool = True
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
  # Temperature of the sampled evaluation ("eval_sampled/"); 0: the rollout temperature
  # (the policy RL optimises). verl-agent validates at 0.4.
  temperature: float = 0.0


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
      (shape_unknown or r.max_prompt_tokens + r.max_action_tokens <= cfg.model.max_seq_len,
       f"rollout.max_prompt_tokens + rollout.max_action_tokens = "
       f"{r.max_prompt_tokens + r.max_action_tokens} exceeds model.max_seq_len "
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


def has_sft_checkpoint(run_dir: str) -> bool:
  """Whether `run_dir` is a run whose SFT stage finished: its sft/ directory holds a
  saved step (orbax names steps by number and writes them under a temporary name until
  they are complete)."""
  sft = os.path.join(run_dir, "sft")
  return os.path.isdir(sft) and any(d.isdigit() for d in os.listdir(sft))


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
