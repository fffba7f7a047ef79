"""Every config leaf: the values it accepts and one line of help.

`FIELDS` maps each dotted key of `ExperimentConfig` (csa_jax/config.py) to a `Field`: a
one-line help and, for a leaf whose values have a range or a set of names, a rule.
`first_problem(cfg)` runs on every config the launcher builds (`config.validate` calls
it first): a value of the wrong type, a float that is not finite, a number out of range
or an unknown name is a `ConfigError` that names the key, the value and what is valid,
before anything runs. `describe(cfg)` lists every leaf with its type, value, valid range
and help (`launch.py --show-config`).

Adding a field to a config dataclass: add its entry here (tests/test_validation.py fails
for a leaf without one). A rule on one field lives here and only here; rules that involve
several fields (or the file system) stay in `config.validate`. csa_jax/config.py imports
this module, so it imports nothing of the config's (it walks any dataclass tree).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, Iterator, Mapping

from csa_jax.methods import METHODS


# The estimators' registry and the loss's modes live with their (jax) code; they are read
# when a value is checked, so that defining and reading configs imports no jax.
def _estimators():
  from csa_jax import estimators  # pylint: disable=g-import-not-at-top
  return estimators.list_estimators()


def _agg_modes():
  from csa_jax import losses  # pylint: disable=g-import-not-at-top
  return losses.AGG_MODES


def _kl_kinds():
  from csa_jax import losses  # pylint: disable=g-import-not-at-top
  return losses.KL_KINDS

# ----------------------------------------------------------------------------------------
# Rules: each says what is valid (for --show-config) and checks a value (None when fine,
# else what is wrong, appended to "KEY=VALUE: ").


@dataclasses.dataclass(frozen=True)
class Rule:
  what: str | Callable[[], str]  # what is valid, e.g. ">= 1", "in [0, 1]", "one of: a, b"
  ok: Callable[[Any], bool]
  # Values just outside the range (tests/test_validation.py sets each of them).
  bad: tuple = ()

  @property
  def text(self) -> str:
    return self.what() if callable(self.what) else self.what


def ge(lo, note: str = "") -> Rule:
  return Rule(f">= {lo}{note}", lambda v: v >= lo, (lo - 1, -1e9))


def gt(lo, note: str = "") -> Rule:
  return Rule(f"> {lo}{note}", lambda v: v > lo, (lo, lo - 1))


def within(lo, hi, *, lo_open: bool = False, hi_open: bool = False, note: str = "") -> Rule:
  text = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}{note}"
  bad = (lo - 0.5, hi + 0.5) + ((lo,) if lo_open else ()) + ((hi,) if hi_open else ())
  return Rule(text, lambda v: (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi),
              bad)


def one_of(names: Callable[[], Any] | tuple, note: str = "") -> Rule:
  """A known name; `names` may be a function (a registry read when checked)."""
  get = names if callable(names) else (lambda: names)

  def what() -> str:
    known = [repr(n) for n in get()]
    return (" or ".join(known) if len(known) <= 2 else f"one of {', '.join(known)}") + note

  return Rule(what, lambda v: v in tuple(get()), ("nosuch",))


def each_ge(lo) -> Rule:
  """A tuple of ints, each >= lo (it may be empty)."""
  ok = lambda v: isinstance(v, tuple) and all(
      isinstance(i, int) and not isinstance(i, bool) and i >= lo for i in v)
  return Rule(f"ints >= {lo}, comma-separated", ok, (str(lo - 1),))


def nonempty() -> Rule:
  return Rule("not empty", lambda v: bool(v), ("",))


def off_or_gt(lo, note: str = "") -> Rule:
  return Rule(f"0 (off) or > {lo}{note}", lambda v: v == 0 or v > lo, (lo, -1))


@dataclasses.dataclass(frozen=True)
class Field:
  help: str
  rule: Rule | None = None


def _envs():
  import environments  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from environments.registry import list_envs  # pylint: disable=import-outside-toplevel
  return list_envs()


F = Field
FIELDS: dict[str, Field] = {
    "name": F("the experiment's name; the default work directory is runs/NAME", nonempty()),
    "seed": F("seed of the model's initialisation, task sampling and sampler keys", ge(0)),
    "mesh": F("device mesh DATAxMODEL (FSDP over data, tensor parallel over model); "
              "checked against the visible devices at start"),
    # env
    "env.name": F("the registered environment (environments/registry.py)", one_of(_envs)),
    "env.kwargs": F("keyword arguments of make_env(env.name, ...); the environment checks "
                    "them at start"),
    "env.train_split": F("the split RL and the demonstrations draw tasks from"),
    "env.eval_split": F("the split held-out evaluation plays"),
    "env.num_train_tasks": F("RL samples tasks 0 .. num_train_tasks-1 of train_split", ge(1)),
    "env.pool_backend": F("environment workers: 'thread' (JVM engines) or 'process' "
                          "(engines whose work is Python)", one_of(("thread", "process"))),
    # tokenizer
    "tokenizer.vocab_size": F("size of the byte-level BPE trained on the demonstrations "
                              "(from-scratch policies; 256 bytes + pad + end at least)",
                              ge(258)),
    "model_origin": F("where model_path's weights came from (path, sha256s, GGUF source): "
                      "recorded when the run's config is resolved, not set by hand"),
    "model_path": F("a local Hugging Face Llama/Qwen2 directory to start from (its shape "
                    "replaces model's at start); empty: a decoder of `model`'s shape "
                    "trained from scratch"),
    "pretrained": F("the checkpoint the experiment is for: model_path is required, unless "
                    "it is packaged (imported into the cache on first use); empty: any "
                    "policy"),
    # model (csa_jax/model/config.py checks these too when they are set)
    "model.vocab_size": F("embedding rows (>= the tokenizer's size)", ge(1)),
    "model.hidden_size": F("width of the residual stream", ge(1)),
    "model.intermediate_size": F("width of the SwiGLU MLP", ge(1)),
    "model.num_layers": F("decoder layers", ge(1)),
    "model.num_heads": F("query heads (a multiple of num_kv_heads)", ge(1)),
    "model.num_kv_heads": F("key/value heads (grouped-query attention)", ge(1)),
    "model.head_dim": F("width of one attention head (even: rotary embeddings)", ge(2)),
    "model.rope_theta": F("rotary embedding base", gt(0)),
    "model.rope_scaling": F("Llama 3.1 rope scaling (None: off); set inside a preset"),
    "model.rope_scaling.factor": F("Llama 3.1 rope scaling: low frequencies divided by this",
                                   gt(0)),
    "model.rope_scaling.low_freq_factor": F("Llama 3.1 rope scaling: low-frequency bound",
                                            gt(0)),
    "model.rope_scaling.high_freq_factor": F("Llama 3.1 rope scaling: high-frequency bound "
                                             "(> low_freq_factor)", gt(0)),
    "model.rope_scaling.original_max_position_embeddings": F(
        "Llama 3.1 rope scaling: the context length it was trained at", ge(1)),
    "model.rms_norm_eps": F("epsilon of the RMS norms", gt(0)),
    "model.tie_embeddings": F("share the input embedding and the output projection"),
    "model.qkv_bias": F("biases on the q/k/v projections (Qwen2)"),
    "model.max_seq_len": F("longest sequence (prompt + action budget must fit)", ge(1)),
    "model.param_dtype": F("storage dtype of the parameters",
                           one_of(("float32", "bfloat16"))),
    "model.dtype": F("compute dtype of matmuls and activations",
                     one_of(("float32", "bfloat16"))),
    "model.remat": F("rematerialise each layer in the backward pass (saves memory)"),
    "model.lora.rank": F("LoRA adapters' rank on the targeted projections (0: off, every "
                         "parameter trains)", ge(0)),
    "model.lora.alpha": F("LoRA scale: the update is alpha / rank x (x A) B", gt(0)),
    "model.lora.targets": F("projections that get adapters (q_proj, k_proj, v_proj, o_proj, "
                            "gate_proj, up_proj, down_proj)"),
    "model.lora.param_dtype": F("storage dtype of the adapters",
                                one_of(("float32", "bfloat16"))),
    "model.scan_layers": F("stack the layers and run them as one lax.scan (compile time "
                           "flat in depth)"),
    # rollout
    "rollout.tasks_per_iter": F("B: tasks per RL iteration", ge(1)),
    "rollout.group_size": F("G: rollouts per task (group-relative advantages need two)",
                            ge(2)),
    "rollout.max_turns": F("T: agent steps per episode at most", ge(1)),
    "rollout.history_turns": F("past (action, observation) pairs shown in the prompt", ge(0)),
    "rollout.max_prompt_tokens": F("prompt budget in tokens (the environment's first "
                                   "prompts are checked against it at start)", ge(1)),
    "rollout.max_action_tokens": F("tokens one action (or reasoning + action) may take",
                                   ge(1)),
    "rollout.temperature": F("sampling temperature of RL rollouts", gt(0)),
    "rollout.top_p": F("nucleus sampling (RL needs 1.0: no truncation)",
                       within(0, 1, lo_open=True)),
    "rollout.top_k": F("top-k sampling (RL needs 0: off)", ge(0)),
    "rollout.num_envs": F("environment slots played in parallel (sampler rows)", ge(1)),
    "rollout.step_timeout_s": F("seconds an environment step may take before the episode "
                                "is cut", gt(0)),
    "rollout.logp_reduce": F("a step's log-prob: sum or mean over its action tokens",
                             one_of(("sum", "mean"))),
    "rollout.anchor": F("GiGPO's anchor state: the environment's state id or the "
                        "observation text", one_of(("state", "faithful"))),
    "rollout.action_format": F("'bare': the answer is the action; 'think': reasoning, then "
                               "<action>...</action>", one_of(("bare", "think"))),
    "rollout.system_prompt": F("a chat model's system message (empty: its template's "
                               "default); unused by from-scratch policies"),
    "rollout.prefill_chunk": F("prompt rows per prefill pass (0: all at once); divides the "
                               "sampler's rows", ge(0)),
    "rollout.overlap": F("step one half of the environments while the device samples for "
                         "the other"),
    "rollout.sampler_shapes": F("'bucket': a call's prompts in one batch of bucketed rows and "
                                "width; 'fit': grouped by length, fitted widths",
                                one_of(("bucket", "fit"))),
    "rollout.share_prefix": F("prefill the prompts' common prefix once per sampler call"),
    # algo
    "algo.method": F("what drives an RL iteration (csa_jax/algorithms)", one_of(METHODS)),
    "algo.estimator": F("the advantage estimator of method 'estimator' "
                        "(csa_jax/estimators/)", one_of(_estimators)),
    "algo.lam": F("CSA: weight of the counterfactual step term, A = A_E + lam * A_S (0: "
                  "GRPO, 1: the step-level ablation)", within(0, 1)),
    "algo.gamma": F("discount of step returns (GiGPO, CSA+GiGPO)", within(0, 1)),
    "algo.w": F("GiGPO: weight of the step-group term", ge(0)),
    "algo.eps": F("added to standard deviations before dividing", gt(0)),
    "algo.ddof": F("delta degrees of freedom of the estimators' standard deviations (1: "
                   "unbiased, as torch.std in GRPO)", ge(0)),
    "algo.std_normalize": F("divide group advantages by the group's standard deviation"),
    "algo.decisive_steps": F("csa_decisive / csa_routine: the step indices whose step term "
                             "is kept / left out", each_ge(0)),
    "algo.clip_low": F("PPO ratio clip below: 1 - clip_low", within(0, 1, hi_open=True)),
    "algo.clip_high": F("PPO ratio clip above: 1 + clip_high", ge(0)),
    "algo.dual_clip": F("dual-clip bound for negative advantages (DAPO/verl use 3)",
                        off_or_gt(1)),
    "algo.loss_agg": F("how token losses are averaged (csa_jax/losses.py)",
                       one_of(_agg_modes)),
    "algo.kl_coef": F("weight of the KL to the SFT policy (0: off)", ge(0)),
    "algo.kl_kind": F("KL estimator", one_of(_kl_kinds)),
    "algo.ref_dtype": F("dtype of the KL reference's copy ('': the parameters')",
                        one_of(("", "float32", "bfloat16"))),
    "algo.entropy_coef": F("entropy bonus weight (0: off)", ge(0)),
    "algo.dynamic_sampling": F("DAPO: drop groups whose rewards are all equal and sample "
                               "more"),
    "algo.dynamic_sampling_rounds": F("DAPO: rounds of B groups per iteration at most", ge(1)),
    "algo.overlong_cache_frac": F("DAPO overlong shaping: the last fraction of the length "
                                  "limit that is penalised (0: off)", within(0, 1)),
    "algo.overlong_factor": F("DAPO overlong shaping: the largest penalty", ge(0)),
    "algo.overlong_per": F("DAPO overlong shaping judges each 'step' or the whole "
                           "'episode'", one_of(("step", "episode"))),
    "algo.invalid_penalty": F("reward lost per action the environment rejected (0: off)",
                              ge(0)),
    "algo.row_weight": F("weight of one agent step: 'step' (all alike) or 'episode' (an "
                         "episode's steps share one weight)", one_of(("step", "episode"))),
    "algo.update_rows": F("rows the update trains on: all, or decisive (oracle label "
                          "+-1; routine rows left out)", one_of(("all", "decisive"))),
    "algo.log_row_classes": F("log gradient norm, entropy and |advantage| of decisive and "
                              "routine rows apart (needs oracle labels)"),
    "algo.epochs": F("passes over an iteration's rows", ge(1)),
    "algo.minibatch_size": F("rows per RL update", ge(1)),
    "algo.istar.beta": F("iStar: implicit PRM reward scale", gt(0)),
    "algo.istar.alpha": F("iStar: weight of the step term", ge(0)),
    "algo.istar.learning_rate": F("iStar: PRM learning rate", gt(0)),
    "algo.istar.grad_clip": F("iStar: PRM gradient clip (0: off)", ge(0)),
    "algo.istar.batch_rows": F("iStar: rows per PRM batch", ge(1)),
    "algo.spa.explore_tasks": F("SPA-RL: training tasks explored after SFT", ge(1)),
    "algo.spa.explore_k": F("SPA-RL: exploration rollouts per task", ge(1)),
    "algo.spa.learning_rate": F("SPA-RL: progress estimator learning rate", gt(0)),
    "algo.spa.grad_clip": F("SPA-RL: estimator gradient clip (0: off)", ge(0)),
    "algo.spa.epochs": F("SPA-RL: estimator epochs", ge(1)),
    "algo.spa.batch_rows": F("SPA-RL: rows per estimator batch", ge(1)),
    "algo.spa.progress_coef": F("SPA-RL: weight of the estimated progress in the step "
                                "reward"),
    "algo.spa.grounding": F("SPA-RL: size of the grounding term (see grounding_mode)", ge(0)),
    "algo.spa.grounding_mode": F("SPA-RL: 'penalty' (-grounding per rejected action) or "
                                 "'bonus' (+grounding per executed one, the paper's form)",
                                 one_of(("penalty", "bonus"))),
    "algo.spa.explore_share": F("SPA-RL: share of rl_env_steps its exploration may use",
                                within(0, 1, lo_open=True)),
    "algo.spa.gamma": F("SPA-RL: discount of step returns", within(0, 1)),
    "algo.mtdpo.beta": F("multi-turn DPO: beta (the KL anchor)", gt(0)),
    "algo.mtdpo.reference": F("multi-turn DPO: reference policy, the SFT weights or the "
                              "previous iteration's", one_of(("sft", "previous"))),
    # optim
    "optim.learning_rate": F("RL learning rate (AdamW)", gt(0)),
    "optim.warmup_steps": F("linear warm-up updates (0: none)", ge(0)),
    "optim.weight_decay": F("AdamW weight decay", ge(0)),
    "optim.grad_clip": F("global gradient-norm clip (0: off)", ge(0)),
    "optim.b1": F("AdamW beta1", within(0, 1, hi_open=True)),
    "optim.b2": F("AdamW beta2", within(0, 1, hi_open=True)),
    "optim.mu_dtype": F("dtype of AdamW's first moment ('': the parameters')",
                        one_of(("", "float32", "bfloat16"))),
    "optim.micro_batch_size": F("rows per forward/backward pass (gradient accumulation; "
                                "0: the whole batch)", ge(0)),
    "optim.pack_rows": F("pack training rows into fixed-length sequences (less padding)"),
    "optim.share_prefix": F("compute the prompt prefix every training row shares once per "
                            "micro-batch (unpacked minibatches of pack_rows, one process)"),
    "optim.max_nonfinite_in_a_row": F("skipped non-finite updates in a row that stop the "
                                      "run (0: never)", ge(0)),
    # sft
    "sft.num_demos": F("expert demonstrations: the first N training tasks", ge(1)),
    "sft.demos_dir": F("where demonstrations are built (empty: $CSA_JAX_CACHE/demos or "
                       "~/.cache/csa_jax/demos)"),
    "sft.epochs": F("passes over the demonstrations", ge(1)),
    "sft.batch_size": F("rows per SFT update", ge(1)),
    "sft.learning_rate": F("SFT learning rate", gt(0)),
    "sft.init_from": F("a run directory whose SFT stage to start from (empty: run SFT here)"),
    "sft.demo_filter": F("which expert episodes are cloned: won ones, or all (a noisy "
                         "demonstrator, as on KeyDoor)", one_of(("won", "all"))),
    # eval
    "eval.num_episodes": F("held-out tasks evaluated, one episode each", ge(1)),
    "eval.first_task": F("the first held-out task index of eval_split", ge(0)),
    "eval.greedy": F("evaluate with greedy actions"),
    "eval.sampled": F("evaluate with actions sampled at eval.temperature"),
    "eval.every": F("evaluate every N RL iterations (0: before and after RL only)", ge(0)),
    "eval.every_episodes": F("held-out tasks of the intermediate evaluations (0: "
                             "eval.num_episodes)", ge(0)),
    "eval.every_greedy": F("intermediate evaluations also greedy (else sampled only)"),
    "eval.oracle_prob": F("also the exact probability of the oracle action at each "
                          "held-out task's first step"),
    "eval.temperature": F("temperature of the sampled evaluation (0: the rollout's)", ge(0)),
    # log
    "log.wandb": F("also log every metrics line to Weights & Biases (WANDB_MODE=offline: on "
                   "disk only, in the work directory's wandb/)"),
    "log.wandb_project": F("the W&B project the run is logged to"),
    # top level
    "rl_iterations": F("RL iterations (0: SFT and its evaluation only)", ge(0)),
    "rl_env_steps": F("RL budget in environment steps (0: none, rl_iterations only)", ge(0)),
    "checkpoint_every": F("save a checkpoint every N RL iterations", ge(1)),
    "log_every": F("write sft/nll every N SFT batches (RL writes every iteration)", ge(1)),
    "device_memory_gb": F("memory per device --dry-run checks against (0: the device's)",
                          ge(0)),
}


# ----------------------------------------------------------------------------------------
# Walking a config.


@dataclasses.dataclass(frozen=True)
class Leaf:
  key: str
  type: str  # the declared type, as --show-config prints it
  value: Any
  declared: Any  # the declared type itself


def _type_name(t: Any) -> str:
  if isinstance(t, type):
    return t.__name__
  return str(t).replace("typing.", "")


def leaves(cfg: Any, prefix: str = "") -> Iterator[Leaf]:
  """Every leaf of a config tree in field order; env.kwargs entries as env.kwargs.KEY."""
  hints = typing.get_type_hints(type(cfg))
  for f in dataclasses.fields(cfg):
    key, value = prefix + f.name, getattr(cfg, f.name)
    if dataclasses.is_dataclass(value):
      yield from leaves(value, key + ".")
    elif isinstance(value, Mapping):
      if not value:  # its entries below stand for it otherwise
        yield Leaf(key, _type_name(hints[f.name]), dict(value), hints[f.name])
      for k, v in value.items():
        yield Leaf(f"{key}.{k}", type(v).__name__, v, type(v))
    else:
      yield Leaf(key, _type_name(hints[f.name]), value, hints[f.name])


def declared_keys(cls: type, prefix: str = "") -> list[str]:
  """Every dotted key the config dataclass `cls` (e.g. ExperimentConfig) declares (an
  optional section both as itself and with its fields), whatever values an experiment
  gives them."""
  out = []
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    t = hints[f.name]
    inner = [a for a in typing.get_args(t) if dataclasses.is_dataclass(a)]
    if dataclasses.is_dataclass(t):
      out += declared_keys(t, prefix + f.name + ".")
    else:
      out.append(prefix + f.name)
      for a in inner:  # e.g. model.rope_scaling: None or a Llama3RopeScaling
        out += declared_keys(a, prefix + f.name + ".")
  return out


def field_for(key: str) -> Field | None:
  if key in FIELDS:
    return FIELDS[key]
  if key.startswith("env.kwargs."):
    return Field("an argument of the environment (make_env(env.name, ...)), checked by it "
                 "at start")
  return None


def _type_error(leaf: Leaf) -> str | None:
  """What is wrong with the value's type, or None (Python configs are not parsed)."""
  t, v = leaf.declared, leaf.value
  if t is bool and not isinstance(v, bool):
    return "expected true or false"
  if t is int and (isinstance(v, bool) or not isinstance(v, int)):
    return "expected an int"
  if t is float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      return "expected a number"
    if not math.isfinite(v):
      return "expected a finite number"
  if t is str and not isinstance(v, str):
    return "expected text"
  return None


def first_problem(cfg: Any) -> str | None:
  """What is wrong with the first leaf whose value is of the wrong type, not finite, out
  of its range or an unknown name (`config.validate` raises it as a ConfigError); None
  when every leaf is fine."""
  for leaf in leaves(cfg):
    field = FIELDS.get(leaf.key)
    problem = _type_error(leaf)
    if problem:
      return f"{leaf.key}={leaf.value!r}: {problem}"
    if field is not None and field.rule is not None and not field.rule.ok(leaf.value):
      return f"{leaf.key} must be {field.rule.text} (got {leaf.value!r}): {field.help}"
  return None


def describe(cfg: Any) -> list[tuple[str, str, str, str]]:
  """(key, type, value, "help (valid values)") for every leaf of `cfg`."""
  rows = []
  for leaf in leaves(cfg):
    field = field_for(leaf.key)
    text = field.help if field else "(no help: add it to csa_jax/config_fields.py)"
    if field and field.rule is not None:
      text += f" [{field.rule.text}]"
    rows.append((leaf.key, leaf.type, repr(leaf.value), text))
  return rows


def format_table(rows: list[tuple[str, str, str, str]]) -> str:
  wk = max(len(r[0]) for r in rows)
  wt = max(len(r[1]) for r in rows)
  wv = min(max(len(r[2]) for r in rows), 24)
  out = []
  for key, typ, value, text in rows:
    if len(value) > wv:  # long values on their own line, the help below them
      out.append(f"{key:{wk}}  {typ:{wt}}  {value}")
      out.append(f"{'':{wk}}  {'':{wt}}  {'':{wv}}  {text}")
    else:
      out.append(f"{key:{wk}}  {typ:{wt}}  {value:{wv}}  {text}")
  return "\n".join(out)
