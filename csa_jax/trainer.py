"""The host loop: demonstrations -> tokenizer -> SFT -> RL with group advantages -> eval.

Shape of one RL iteration (ARCHITECTURE.md): B tasks x G copies are played by the
environment pool against the jitted sampler; the episodes become padded [B, G, T]
arrays; a jitted estimator (CSA by default) turns them into per-step advantages; a grain
pipeline turns steps into fixed-shape rows; the jitted clipped update runs over them.
Everything that is saved (metrics, checkpoints, config, tokenizer, learning curve) lives
under the work directory; a checkpoint after SFT and every few RL iterations makes a
crashed run resumable with `--resume`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import grain
from flax import nnx
from tqdm.auto import tqdm

from csa_jax import advantages as adv_lib
from csa_jax import algorithms
from csa_jax import data as data_lib
from csa_jax import distributed as dist
from csa_jax import mesh as mesh_lib
from csa_jax import metrics as metrics_lib
from csa_jax import perf as perf_lib
from csa_jax import rollout as rollout_lib
from csa_jax import sampling
from csa_jax import train_step as ts
# Re-exported: the estimator methods' reward shaping and advantages live with them now.
from csa_jax.algorithms.estimator import compute_advantages, shaped_rewards  # noqa: F401
from csa_jax.checkpoint import Checkpointer, CheckpointError
from csa_jax.config import ConfigError, ExperimentConfig, demos_dir, micro_batches, to_dict
from csa_jax.signals import Interrupted, StopOnSignal
from csa_jax.model import Decoder, hf, lora
from csa_jax.tokenizer import Tokenizer, train_bpe
from environments import demos as demos_lib
from environments.pool import EnvPool
from environments.registry import make_env


# ----------------------------------------------------------------------------------------
# Pieces the loop is made of.


def demo_rows(records, tok: Tokenizer, cfg: ExperimentConfig,
              fmt: rollout_lib.PromptFormat = rollout_lib.PLAIN) -> list[data_lib.Row]:
  """Behaviour-cloning rows: every expert step, with the prompt the policy would see."""
  rows = []
  for rec in records:
    history: list[tuple[str, str]] = []
    for t, action in enumerate(rec["actions"]):
      prompt = rollout_lib.encode_prompt(
          tok, rec["task"], history, rec["observations"][t], rec["admissible"][t],
          history_turns=cfg.rollout.history_turns, max_tokens=cfg.rollout.max_prompt_tokens,
          fmt=fmt)
      action_ids = (tok.encode(fmt.answer_text(action))[: cfg.rollout.max_action_tokens - 1]
                    + [tok.eos_id])
      rows.append(data_lib.sft_row(prompt, action_ids))
      history.append((action, rec["observations"][t + 1] if t + 1 < len(rec["observations"])
                      else ""))
  return rows


def demo_corpus(records, fmt: rollout_lib.PromptFormat = rollout_lib.PLAIN) -> list[str]:
  """The text a tokenizer is trained on: everything a prompt or an action can hold."""
  texts = []
  for rec in records:
    texts.append(rec["task"])
    texts.extend(rec["observations"])
    texts.extend(" " + a for a in rec["actions"])
    texts.extend(" | ".join(adm) for adm in rec["admissible"])
  texts.append("Task: Now: Actions: Action: > |")
  texts.append(fmt.cue + fmt.answer_text(""))
  return texts


def sampling_config(cfg: ExperimentConfig, tok: Tokenizer, *, greedy: bool,
                    temperature: float | None = None) -> sampling.SamplingConfig:
  r = cfg.rollout
  return sampling.SamplingConfig(
      max_new_tokens=r.max_action_tokens, temperature=temperature or r.temperature, top_p=r.top_p,
      top_k=r.top_k, greedy=greedy, stop_token_ids=(tok.eos_id,))


class SamplerPolicy:
  """The jitted sampler as a host-side policy over lists of token ids.

  Its randomness is its own jax key stream (`key`, split once per call), which the
  checkpoint saves so that a resumed run samples what the uninterrupted one would have.
  """

  def __init__(self, graphdef, get_params, tok: Tokenizer, cfg: ExperimentConfig, *,
               greedy: bool, key: jax.Array, mesh=None, temperature: float | None = None):
    self._graphdef, self._get_params, self._tok, self._mesh = graphdef, get_params, tok, mesh
    self._scfg = sampling_config(cfg, tok, greedy=greedy, temperature=temperature)
    self._bucket = cfg.rollout.max_prompt_tokens
    self._prefill_chunk = cfg.rollout.prefill_chunk
    self.key = key

  def __call__(self, prompts: list[list[int]], rng: np.random.Generator):
    return self.collect(self.dispatch(prompts, rng))

  def dispatch(self, prompts: list[list[int]], rng: np.random.Generator
               ) -> sampling.SampleOutput:
    """Starts sampling and returns at once (JAX dispatch is asynchronous): the arrays
    are ready when `collect` reads them (rollout.overlap steps environments meanwhile)."""
    del rng  # the sampler's randomness comes from its own jax key stream
    live, (rows, width) = self._live(prompts), self.sampler_shape(prompts)
    # Rows beyond the live ones repeat the first (one shared prefill; a call of dummies
    # alone samples one of them); their answers are dropped.
    first = live[0] if live else 0
    chosen = live + [first] * (rows - len(live))
    tokens, mask = sampling.left_pad([prompts[i] for i in chosen], self._tok.pad_id,
                                     bucket=width)
    self.key, sub = jax.random.split(self.key)
    model = nnx.merge(self._graphdef, self._get_params())
    out = sampling.sample(model, jnp.asarray(tokens), jnp.asarray(mask), rng=sub,
                          cfg=self._scfg, pad_id=self._tok.pad_id, mesh=self._mesh,
                          prefill_chunk=self._prefill_chunk)
    return out, live, len(prompts)

  def _live(self, prompts: list[list[int]]) -> list[int]:
    """The rows worth sampling: not the rollout's dummies of finished or idle slots."""
    dummy = rollout_lib.dummy_prompt(self._tok)
    return [i for i, p in enumerate(prompts) if p != dummy]

  def sampler_shape(self, prompts: list[list[int]]) -> tuple[int, int]:
    """(rows, prompt width) the sampler runs for `prompts`. Rows: the live ones rounded up
    to a quarter, a half or all of the call's rows (a multiple of the mesh's data axis), so
    finished slots stop costing and a run compiles at most three row counts per width.
    Width: the longest prompt rounded up to a power of two, at most the prompt budget, so
    short prompts do not pay for the whole budget. The rollout counts padding with these."""
    n, live = len(prompts), max(len(self._live(prompts)), 1)
    data = 1 if self._mesh is None else self._mesh.shape["data"]
    rows = next(r for r in (-(-n // d // data) * data for d in (4, 2, 1)) if r >= live)
    return rows, sampling.bucket_length(max(map(len, prompts)), self._bucket)

  @staticmethod
  def collect(pending) -> tuple[list[list[int]], list[list[float]]]:
    """The answers of `dispatch`'s call, one per prompt it was given (empty for the rows it
    did not sample)."""
    out, live, n = pending
    ids, logps, lens = (np.asarray(out.tokens_BxN), np.asarray(out.logprobs_BxN),
                        np.asarray(out.lengths_B))
    got_ids, got_logps = [[] for _ in range(n)], [[] for _ in range(n)]
    for row, i in enumerate(live):
      got_ids[i], got_logps[i] = ids[row, :lens[row]].tolist(), logps[row, :lens[row]].tolist()
    return got_ids, got_logps

  # The key as JSON (the checkpoint's meta) and back.
  def key_state(self) -> list[int]:
    return np.asarray(jax.random.key_data(self.key)).tolist()

  def set_key_state(self, data: list[int]) -> None:
    self.key = jax.random.wrap_key_data(np.asarray(data, np.uint32))


def evaluate(pool, policy, tok, cfg: ExperimentConfig, label: str, prefix: str,
             fmt: rollout_lib.PromptFormat = rollout_lib.PLAIN) -> tuple[dict, list]:
  """eval.num_episodes held-out tasks from eval.first_task on, one episode each (split
  across processes; the metrics are over all of them, the episodes this process's)."""
  n, first = cfg.eval.num_episodes, cfg.eval.first_task
  tasks = dist.share([(cfg.env.eval_split, first + i) for i in range(n)])
  with tqdm(total=len(tasks), desc=f"eval {label}", unit="ep", leave=False) as bar:
    trajs = rollout_lib.run_episodes(pool, policy, tok, tasks, cfg.rollout,
                                     np.random.default_rng(0), on_wave=bar.update, fmt=fmt)
  return dist.episode_metrics(trajs, prefix), trajs


class SetupError(ConfigError):
  """A run that cannot work as configured, found at start-up (one line says why)."""


def check_environment(cfg: ExperimentConfig) -> None:
  """Builds one environment here and resets the first training and held-out tasks, so
  that a bad environment argument, split or task range is one line before anything is
  written, not a traceback from a worker minutes later."""
  e = cfg.env
  what = f"environment {e.name} {dict(e.kwargs)}"
  try:
    env = make_env(e.name, **dict(e.kwargs))
  except Exception as err:  # pylint: disable=broad-except  (any engine's own error)
    raise SetupError(f"{what}: {_one_line(err)}") from None
  try:
    for split, first, count, field in (
        (e.train_split, 0, e.num_train_tasks, "env.num_train_tasks"),
        (e.eval_split, cfg.eval.first_task, cfg.eval.num_episodes,
         "eval.first_task + eval.num_episodes")):
      try:
        n = env.num_tasks(split)
        env.reset(split, first)
      except Exception as err:  # pylint: disable=broad-except
        raise SetupError(f"{what}, split {split!r}: {_one_line(err)}") from None
      if first + count > n:
        raise SetupError(f"{field} = {first + count} but {what} has {n} tasks in split "
                         f"{split!r}")
  finally:
    env.close()


def check_processes(cfg: ExperimentConfig) -> None:
  """Refuses, with several processes, what is not written for them yet: methods with an
  auxiliary model or episodes of their own (their extra batches and exploration are not
  split across processes), dynamic sampling (a process could end a round with no group
  while others train), and fewer task groups than processes."""
  p = dist.process_count()
  if p == 1:
    return
  if cfg.algo.method != "estimator":
    raise SetupError(f"algo.method {cfg.algo.method} runs on one process only; with {p} "
                     "processes use an estimator method (algo.method=estimator)")
  if cfg.algo.dynamic_sampling:
    raise SetupError(f"algo.dynamic_sampling runs on one process only ({p} here)")
  if cfg.rollout.tasks_per_iter < p:
    raise SetupError(f"rollout.tasks_per_iter={cfg.rollout.tasks_per_iter} task groups "
                     f"cannot be shared by {p} processes: at least one each")


def _one_line(err: BaseException) -> str:
  # A KeyError's str() is the repr of its message: take the message itself.
  text = (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
          ).strip().splitlines()
  return f"{type(err).__name__}: {text[0] if text else ''}"


class NonFiniteError(RuntimeError):
  """Too many updates in a row had a non-finite loss or gradient: the run diverged."""


class NonFiniteGuard:
  """Counts the updates the jitted step skipped (`train_step.apply_update`) and stops
  the run after `limit` in a row (0: never), naming where and what was not finite."""

  def __init__(self, limit: int):
    self.limit, self.in_a_row, self.total = limit, 0, 0

  def observe(self, metrics: dict, where: str) -> bool:
    """True when this update was skipped."""
    what = [name for name in ("loss", "grad") if float(metrics[f"nonfinite_{name}"]) > 0]
    if not what:
      self.in_a_row = 0
      return False
    self.in_a_row += 1
    self.total += 1
    if self.limit and self.in_a_row >= self.limit:
      raise NonFiniteError(
          f"{where}: {self.in_a_row} updates in a row skipped because the "
          f"{' and the '.join('gradient' if w == 'grad' else w for w in what)} "
          f"{'were' if len(what) > 1 else 'was'} not finite "
          f"(optim.max_nonfinite_in_a_row={self.limit}); lower optim.learning_rate or "
          "resume from an earlier checkpoint")
    return True

  def state(self) -> dict:
    return {"in_a_row": self.in_a_row, "total": self.total}

  def load(self, state: dict) -> None:
    self.in_a_row, self.total = int(state["in_a_row"]), int(state["total"])


# ----------------------------------------------------------------------------------------
# The run.


@dataclasses.dataclass
class Trainer:
  cfg: ExperimentConfig
  workdir: str
  resume: bool = False

  def __post_init__(self):
    c = self.cfg
    os.makedirs(self.workdir, exist_ok=True)
    self.mesh = mesh_lib.make_mesh(c.mesh)
    check_processes(c)
    try:
      self.sampler_mesh = dist.SamplerMesh(self.mesh)
    except ValueError as e:  # a 'model' axis across hosts
      raise SetupError(str(e)) from None
    self.ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"))
    self.sft_ckpt = Checkpointer(os.path.join(self.workdir, "sft"), max_to_keep=1)
    if self.resume and self.ckpt.latest_step() is None:
      raise CheckpointError(f"--resume: no checkpoint in {self.ckpt.directory}")
    if dist.is_writer():
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        json.dump(to_dict(c), f, indent=2)
    self.writer = (metrics_lib.MetricsWriter(self.workdir) if dist.is_writer()
                   else metrics_lib.NullWriter(self.workdir))
    self.np_rng = np.random.default_rng(c.seed)
    self.algo = algorithms.get(c.algo.method)
    self.aux: Any = {}  # the method's auxiliary state (models, optimizer states)
    self.env_steps = 0
    # The packed sequence counts (per micro-batch) each phase ("sft", "rl") has compiled
    # an update for: `_batches`.
    self.pack_counts: dict[str, list[int]] = {}
    self.summary: dict[str, Any] = {}
    self.guard = NonFiniteGuard(c.optim.max_nonfinite_in_a_row)
    self.stop = StopOnSignal()
    self.perf = perf_lib.Timer()  # where each RL iteration's time goes (perf/ metrics)

  # -- set-up --------------------------------------------------------------------------

  def _demos(self) -> list[dict]:
    """The expert's won episodes on the first sft.num_demos training tasks, built once
    as a TFDS array_record dataset (shared by all runs on this environment config) and
    read back through grain."""
    c = self.cfg
    print(f"expert demonstrations: {c.sft.num_demos} {c.env.train_split} tasks in "
          f"{demos_dir(c)}")
    source = demos_lib.demo_data_source(
        demos_dir(c), c.env.name, dict(c.env.kwargs),
        split=c.env.train_split, num_tasks={c.env.train_split: c.sft.num_demos})
    records = [r for r in grain.MapDataset.source(source).map(demos_lib.decode_record) if r["won"]]
    for r in records:
      r["admissible"] = [a.split(demos_lib.SEP) if a else [] for a in r["admissible"]]
    return sorted(records, key=lambda r: r["index"])

  def _policy(self, records):
    """(tokenizer, prompt format, graphdef, params): a pretrained HF checkpoint when
    `model_path` is set, else a byte-level BPE trained on the demonstrations and a
    freshly initialised decoder of `model`'s shape."""
    c = self.cfg
    if c.model_path:
      try:
        model, tok = hf.from_pretrained(c.model_path, dtype=c.model.dtype,
                                        param_dtype=c.model.param_dtype,
                                        mesh=self.mesh, rules=mesh_lib.TRAIN_RULES,
                                        remat=c.model.remat,
                                        scan_layers=c.model.scan_layers,
                                        lora=c.model.lora, seed=c.seed)
      except (ValueError, FileNotFoundError) as e:  # HFCheckpointError, tokenizer files
        raise SetupError(f"model_path {c.model_path}: {str(e).splitlines()[0]}") from None
      fmt = (rollout_lib.PromptFormat.chat(tok, c.rollout.action_format) if tok.chat_template
             else rollout_lib.PromptFormat(action_prefix=" ",
                                           action_format=c.rollout.action_format))
    else:
      fmt = rollout_lib.PromptFormat(action_format=c.rollout.action_format)
      path = os.path.join(self.workdir, "tokenizer.json")

      def tokenizer():
        if os.path.exists(path):  # resuming: the ids must stay the ones trained on
          return Tokenizer.load(path)
        tok = train_bpe(demo_corpus(records, fmt), c.tokenizer.vocab_size)
        tok.save(self.workdir)
        return tok

      # Process 0 trains and saves it; the others read that file (the same ids everywhere).
      tok = dist.first_then_rest(tokenizer, "tokenizer")
      if tok.vocab_size > c.model.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} tokens, model.vocab_size is "
                         f"{c.model.vocab_size}")
      model = Decoder(c.model, rngs=nnx.Rngs(c.seed))
      mesh_lib.shard_model(model, self.mesh, mesh_lib.TRAIN_RULES)
    graphdef, params = nnx.split(model, nnx.Param)
    return tok, fmt, graphdef, params

  def _check_budgets(self, pool, records) -> None:
    """Refuses (SetupError) prompt and action budgets that cannot hold what the
    environment asks: the task line and the whole first action list of each
    demonstration (or of the first training tasks' resets), and every expert action."""
    c, r = self.cfg, self.cfg.rollout
    if records is not None:
      firsts = [(rec["task"], rec["admissible"][0]) for rec in records]
      actions = [a for rec in records for a in rec["actions"]]
    else:  # SFT taken from another run: look at the environment itself
      slots = list(range(min(pool.num_envs, 4)))
      res = pool.reset(slots, [(c.env.train_split, i) for i in slots])
      firsts = [(x.info.task, x.info.admissible_actions) for x in res
                if not x.info.error]
      actions = [a for a in pool.expert_action(slots) if a]
    need = max((rollout_lib.prompt_budget_needed(self.tok, *f, fmt=self.fmt) for f in firsts),
               default=0)
    if r.max_prompt_tokens < need:
      raise SetupError(f"rollout.max_prompt_tokens={r.max_prompt_tokens} cannot hold the task "
                       f"line and the action list of {c.env.name}'s first steps: at least "
                       f"{need} fit (model.max_seq_len must allow it plus the action budget)")
    need = max((len(self.tok.encode(self.fmt.answer_text(a))) + 1 for a in actions), default=0)
    if r.max_action_tokens < need:
      raise SetupError(f"rollout.max_action_tokens={r.max_action_tokens} cannot hold the expert's "
                       f"actions (and the end token): at least {need} fit")

  # -- phases --------------------------------------------------------------------------

  def _sft(self, graphdef, params, tok, records) -> Any:
    c = self.cfg
    rows = demo_rows(records, tok, c, self.fmt)
    ds = self._batches(rows, c.sft.batch_size, seed=c.seed, epochs=c.sft.epochs, phase="sft")
    tx = ts.make_optimizer(c.optim, learning_rate=c.sft.learning_rate)
    state = self._fresh_state(params, tx)
    step = ts.make_sft_step(graphdef, tx, micro_batches(c.optim, c.sft.batch_size))
    metrics, tokens = {}, np.zeros(2)
    with tqdm(total=len(ds), desc="sft", unit="batch") as bar:
      for i, batch in enumerate(data_lib.iterate(ds)):
        tokens += data_lib.token_counts(batch)
        state, metrics = step(state, self._to_device(batch))
        self.guard.observe(metrics, f"SFT batch {i + 1}")
        requested = dist.agree_stop(self.stop.requested)
        if requested:  # SFT is not checkpointed midway: abandon it
          raise Interrupted(requested, None, None)
        bar.update()
        bar.set_postfix(nll=f"{float(metrics['nll']):.3f}")
    self.writer.write(0, {f"sft/{k}": float(v) for k, v in metrics.items()} |
                      {"sft/rows": len(rows), "sft/demos": len(records),
                       "sft/pad_frac": 1.0 - tokens[0] / max(tokens[1], 1)})
    return state.params

  def _fresh_state(self, params, tx) -> ts.TrainState:
    """A new train state placed as the jitted update returns it: the parameters by their
    logical axes, the optimizer's moments like their parameter, its counts replicated. A
    fresh optimizer's arrays otherwise sit unplaced, and the second update compiles the
    whole step again for the placed state the first one returned."""
    state = ts.init_state(params, tx)
    if dist.multi():  # a global array from each process's copy: dist.on_mesh
      return dist.on_mesh(state, self.mesh)
    p_sh = mesh_lib.state_shardings(params, self.mesh, mesh_lib.TRAIN_RULES)
    return jax.device_put(state, ts.TrainState(
        step=mesh_lib.replicated(self.mesh), params=p_sh,
        opt_state=mesh_lib.opt_state_shardings(tx, state.opt_state, lora.trainable(p_sh),
                                               self.mesh)))

  def _batches(self, rows, batch_size: int, *, seed: int, epochs: int, phase: str,
               pack: bool | None = None):
    """Batches of `batch_size` rows: inputs as long as prompt + action budgets, one action
    slot per possible action token; packed (`pack`, default optim.pack_rows) into sequences
    of that length, else one row per sequence (one shape). Packed, each minibatch takes a
    sequence count the phase has compiled where one fits, or the unpacked layout where
    packing saves little (`data.reuse_count` over `pack_counts`, saved with checkpoints so
    a resumed run lays rows out as the uninterrupted one): a run compiles a few shapes."""
    r = self.cfg.rollout
    kw = dict(batch_size=batch_size, seq_len=r.max_prompt_tokens + r.max_action_tokens,
              pad_id=self.tok.pad_id, seed=seed, epochs=epochs)
    if not (self.cfg.optim.pack_rows if pack is None else pack):
      return data_lib.batches(rows, action_len=r.max_action_tokens, **kw)
    kw |= dict(micro_batches=micro_batches(self.cfg.optim, batch_size),
               seq_multiple=self.mesh.shape["data"])
    compiled = self.pack_counts.setdefault(phase, [])
    per_micro = batch_size // kw["micro_batches"]
    counts = [data_lib.reuse_count(n, compiled, per_micro)
              for n in data_lib.packed_needs(rows, **kw)]
    return data_lib.packed_batches(rows, action_len=r.max_action_tokens, seqs_per_micro=counts,
                                   **kw)

  def _to_device(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """SFT's batches: the same whole batch in every process."""
    return dist.to_device(batch, self.mesh, whole=True)

  def _sample_tasks(self) -> list[tuple[str, int]]:
    c = self.cfg
    idx = self.np_rng.choice(c.env.num_train_tasks, size=c.rollout.tasks_per_iter, replace=False)
    tasks = [(c.env.train_split, int(i)) for i in idx for _ in range(c.rollout.group_size)]
    return dist.share(tasks, c.rollout.group_size)  # every process draws all, plays its own

  def _collect(self, pool, policy) -> tuple[list, rollout_lib.GroupArrays | None, int]:
    """One batch of B groups; with dynamic sampling, groups whose rewards are all equal
    are dropped and more are sampled (at most `algo.dynamic_sampling_rounds` rounds) to
    fill the batch; the episodes of dropped groups still count as environment steps."""
    c, r = self.cfg, self.cfg.rollout
    kept: list[list] = []
    played = 0
    target = dist.share_count(r.tasks_per_iter)  # this process's groups
    for _ in range(c.algo.dynamic_sampling_rounds if c.algo.dynamic_sampling else 1):
      trajs = rollout_lib.run_episodes(pool, policy, self.tok, self._sample_tasks(), r,
                                       self.np_rng, fmt=self.fmt, perf=self.perf)
      played += sum(t.length for t in trajs)
      groups = [trajs[i:i + r.group_size] for i in range(0, len(trajs), r.group_size)]
      if c.algo.dynamic_sampling:
        won_BxG = np.array([[t.won for t in g] for g in groups], np.float32)
        keep_B = np.asarray(adv_lib.dynamic_sampling_keep(jnp.asarray(won_BxG)))
        groups = [g for g, k in zip(groups, keep_B) if k]
      kept.extend(groups)
      if len(kept) >= target:
        break
    if not kept:  # every group uniform: nothing to learn from this round
      return [], None, played
    kept = kept[:target]
    flat = [t for g in kept for t in g]
    arrays = rollout_lib.group_arrays(flat, len(kept), r.group_size, r.max_turns, r.logp_reduce)
    return flat, arrays, played

  def _rl_iteration(self, it, pool, policy, rl_step, state, ref_params):
    t0 = time.perf_counter()
    trajs, arrays, played = self._collect(pool, policy)
    self.env_steps += dist.count_env_steps(played)
    m = {"perf/env_steps_total": self.env_steps, "perf/rollout_s": time.perf_counter() - t0}
    m |= dist.env_steps_by_process(played)
    if not trajs:
      return state, m | {"perf/update_skipped": 1.0}
    m |= dist.episode_metrics(trajs, "rollout")
    with self.perf.phase("adv"):
      prep = self.algo.prepare(self.ctx, it, trajs, arrays, state.params, self.aux)
    self.aux = prep.aux
    self.env_steps += dist.count_env_steps(prep.env_steps)
    if dist.multi():  # the update is a collective: it runs unless every process skips
      prep = dataclasses.replace(prep, skip=dist.all_true(prep.skip))
    # perf/adv_s (self.perf): the whole prepare (advantages and any auxiliary model work,
    # of which perf/aux_s is the auxiliary part).
    m |= prep.metrics | {"perf/env_steps_total": self.env_steps}
    if prep.adv_BxGxT is not None:
      adv_BxGxT, act, oracle = dist.gather_steps(prep.adv_BxGxT, arrays.mask_BxGxT,
                                                 arrays.oracle_BxGxT)
      m |= {"adv/mean": float(adv_BxGxT[act].mean()), "adv/std": float(adv_BxGxT[act].std()),
            "adv/abs_max": float(np.abs(adv_BxGxT[act]).max()),
            "adv/zero_frac": float((adv_BxGxT[act] == 0).mean())}
      m |= metrics_lib.credit_accuracy(adv_BxGxT, oracle, act)
    if prep.skip:
      return state, m | {"perf/update_skipped": 1.0}
    skipped = 0

    def observe(upd) -> None:  # every policy step passes the host's non-finite guard
      nonlocal skipped
      skipped += self.guard.observe(upd, f"RL iteration {it + 1}")

    state, upd = self.algo.update(self.ctx, rl_step, state, prep, it, ref_params, observe)
    m |= {f"loss/{k}": float(v) for k, v in upd.items()}
    m |= {"perf/update_skipped": 0.0,
          "loss/nonfinite_skipped": skipped, "loss/nonfinite_total": self.guard.total}
    return state, m

  def _tokenizer_and_sft_source(self):
    """(records or None, tokenizer, format, graphdef, params): with `sft.init_from` the
    tokenizer is that run's and no demonstrations are read."""
    c = self.cfg
    if c.model_path:  # load it first: a bad model directory fails before demos are built
      policy = self._policy(None)
      return (None if c.sft.init_from else self._demos(), *policy)
    if not c.sft.init_from:
      records = self._demos()
      return (records, *self._policy(records))
    tok_path = os.path.join(self.workdir, "tokenizer.json")
    if not c.model_path and not os.path.exists(tok_path):
      shutil.copy(os.path.join(c.sft.init_from, "tokenizer.json"), tok_path)
    return (None, *self._policy(None))

  def _sft_stage(self, graphdef, params, records) -> tuple[Any, dict | None]:
    """SFT parameters, and their held-out evaluation when it is already known.

    Taken, in this order, from workdir/sft (a run stopped right after its SFT stage),
    from `sft.init_from`, or cloned here from the demonstrations (evaluation None).
    """
    c = self.cfg
    sources = [self.sft_ckpt]
    if c.sft.init_from:
      sources.append(Checkpointer(os.path.join(c.sft.init_from, "sft"), max_to_keep=1))
    for source in sources:
      if source.latest_step() is not None:
        params, meta = source.restore(params)
        print(f"SFT parameters from {source.directory}")
        return params, meta["sft_eval"]
    if c.sft.init_from:
      raise CheckpointError(f"sft.init_from: no SFT checkpoint in {c.sft.init_from}/sft")
    return self._sft(graphdef, params, self.tok, records), None

  def _kl_reference(self, params_template) -> Any:
    """The KL anchor (algo.kl_coef > 0): the SFT policy, read back from workdir/sft,
    so that a resumed run anchors to SFT and not to the RL weights it restored."""
    if not (self.cfg.algo.kl_coef or self.algo.needs_sft_reference):
      return None
    # LoRA: the SFT adapters over the policy's own base buffers (no copy); else a copy of
    # the SFT parameters, in algo.ref_dtype.
    return self.sft_ckpt.restore(ts.reference_params(params_template,
                                                     self.cfg.algo.ref_dtype))[0]

  def run(self) -> dict[str, Any]:
    """Runs (or resumes) the experiment; the summary of its held-out evaluations.

    SIGTERM/SIGINT stop it after the current RL iteration with a checkpoint saved
    (`Interrupted`); whatever ends it, the metrics are flushed and pending saves finish.
    """
    c = self.cfg
    try:
      with self.stop, EnvPool(c.env.name, dict(c.env.kwargs), c.rollout.num_envs,
                              backend=c.env.pool_backend,
                              step_timeout_s=c.rollout.step_timeout_s) as pool:
        self._run(pool)
    finally:
      self.ckpt.close()
      self.sft_ckpt.close()
      self.writer.close()
    if dist.is_writer():
      metrics_lib.plot_learning_curve(self.writer.path,
                                      os.path.join(self.workdir, "learning_curve.png"),
                                      title=f"{c.name}: {algorithms.label(c.algo)}")
    return self.summary

  def _run(self, pool) -> None:
    c = self.cfg
    records, self.tok, self.fmt, graphdef, params = self._tokenizer_and_sft_source()
    self._check_budgets(pool, records)
    tx = ts.make_optimizer(c.optim)
    state = self._fresh_state(params, tx)
    self.aux = self.algo.init_aux(c, state.params)  # also the template to restore into
    # The parameters the samplers read: the training ones, or with several processes a
    # copy on this process's devices (dist.SamplerMesh), refreshed after every update.
    live = self.sampler_mesh
    live.update(state.params)
    key = jax.random.key(c.seed)
    # Rollouts sample at the rollout temperature; held-out evaluation takes greedy actions
    # ("eval/") and, if asked, sampled ones ("eval_sampled/"), the policy RL optimises.
    self.policies = {"rollout": SamplerPolicy(graphdef, live.params, self.tok, c, greedy=False,
                                              key=dist.process_key(jax.random.fold_in(key, 1)),
                                              mesh=live.mesh)}
    for prefix, greedy, on in (("eval", True, c.eval.greedy),
                               ("eval_sampled", False, c.eval.sampled)):
      if on:
        self.policies[prefix] = SamplerPolicy(
            graphdef, live.params, self.tok, c, greedy=greedy,
            key=dist.process_key(jax.random.fold_in(key, 2 + greedy)), mesh=live.mesh,
            temperature=c.eval.temperature)
    meta = {"phase": "start", "iteration": 0}
    if self.resume:
      state, meta = self._restore(state)
      live.update(state.params)
      if (meta["phase"] == "done" and c.rl_iterations > int(meta["iteration"])
          and not self._budget_spent()):
        meta["phase"] = "rl"  # a finished run extended with a larger rl_iterations

    eval_keys = {k: p.key for k, p in self.policies.items() if k != "rollout"}

    def evaluate_all(label: str) -> dict:
      """Every evaluation samples with the same keys: SFT and RL are compared on common
      random numbers, and an evaluation depends on nothing but the parameters."""
      out = {}
      for prefix, key in eval_keys.items():
        policy = self.policies[prefix]
        policy.key = key
        out |= evaluate(pool, policy, self.tok, c, f"{label} ({prefix})", prefix, self.fmt)[0]
      return out

    if meta["phase"] == "start":
      params, m = self._sft_stage(graphdef, state.params, records)
      state = self._fresh_state(params, tx)
      self.aux = self.algo.init_aux(c, state.params)
      live.update(state.params)
      if m is None:
        m = evaluate_all("SFT")
      # workdir/sft: the KL reference, and the start of any run naming this one in
      # `sft.init_from`.
      if self.sft_ckpt.latest_step() is None:
        self.sft_ckpt.save(0, state.params, {"sft_eval": m})
        self.sft_ckpt.wait()
      self.summary["sft"] = m
      self.writer.write(0, m | {"perf/env_steps_total": 0})
      meta = {"phase": "rl", "iteration": 0}
      self._save(0, state, meta)
    ref_params = self.ref_params = self._kl_reference(state.params)
    self.ctx = self._context(graphdef, tx, pool, live, ref_params)
    rl_step = self.algo.make_step(self.ctx)

    start = last = int(meta["iteration"])
    save_s = 0.0  # the save that ended the previous iteration (perf/checkpoint_s)
    with tqdm(total=c.rl_iterations, initial=start, desc=f"rl ({algorithms.label(c.algo)})",
              unit="it") as bar:
      for it in range(start, c.rl_iterations):
        if self._budget_spent():
          break
        requested = dist.agree_stop(self.stop.requested)
        if requested:  # during SFT's evaluation or a resume: `it` is saved
          raise Interrupted(requested, self.ckpt.directory, it)
        self.perf.reset(checkpoint_s=save_s)
        state, m = self._rl_iteration(it, pool, self.policies["rollout"], rl_step, state,
                                      ref_params)
        live.update(state.params)
        last = it + 1
        if c.eval.every and (it + 1) % c.eval.every == 0 and it + 1 < c.rl_iterations:
          with self.perf.phase("eval"):
            m |= evaluate_all(f"it {it + 1}")
        timing = self.perf.metrics()
        # Environment steps turned into an update, per second of the whole iteration.
        m |= timing | {"perf/env_steps_per_s": m.get("rollout/env_steps", 0.0)
                       / max(timing["perf/iteration_s"], 1e-9)}
        self.writer.write(it + 1, m)
        bar.update()
        bar.set_postfix(success=f"{m.get('rollout/success', float('nan')):.2f}",
                        steps=self.env_steps)
        requested = dist.agree_stop(self.stop.requested)
        save_s = time.perf_counter()
        if (it + 1) % c.checkpoint_every == 0 or requested:
          self._save(it + 1, state, {"phase": "rl", "iteration": it + 1})
        save_s = time.perf_counter() - save_s
        if requested:
          raise Interrupted(requested, self.ckpt.directory, it + 1)
    if c.rl_iterations > 0 and meta["phase"] != "done":
      m = evaluate_all("RL")
      self.summary["rl"] = m
      self.writer.write(last, m | {"perf/env_steps_total": self.env_steps})
      self._save(last, state, {"phase": "done", "iteration": last})

  def _budget_spent(self) -> bool:
    """`rl_env_steps` environment steps taken: RL ends after the iteration that spent them
    (every method gets the same interaction budget, whatever its episode lengths)."""
    return bool(self.cfg.rl_env_steps) and self.env_steps >= self.cfg.rl_env_steps

  # -- checkpoints ----------------------------------------------------------------------

  def _save(self, step: int, state, meta: dict) -> None:
    """Everything that shapes the rest of the run: the train state, and in the meta the
    host side (phase, iteration, env steps, the task-sampling numpy RNG, the rollout
    sampler's key, the non-finite counters). Minibatch order is seeded by the iteration
    and evaluation keys are fixed, so neither needs saving."""
    meta = meta | {"env_steps": self.env_steps, "np_rng": self.np_rng.bit_generator.state,
                   "summary": self.summary, "nonfinite": self.guard.state(),
                   "rollout_key": self.policies["rollout"].key_state(),
                   "processes": dist.process_count(), "pack_counts": self.pack_counts}
    if self.cfg.model.lora.enabled:  # the checkpoint holds the adapters; this, the base
      meta["lora_base"] = self.cfg.model_path or f"from scratch, seed {self.cfg.seed}"
    if dist.multi():  # each process's own sampler stream; the meta is process 0's
      keys = dist.gather_concat(np.asarray(self.policies["rollout"].key_state(), np.uint32))
      meta["rollout_keys"] = keys.reshape(dist.process_count(), -1).tolist()
    self.ckpt.save(step, algorithms.pack_state(state, self.aux),
                   json.loads(json.dumps(meta, default=float)))

  def _context(self, graphdef, tx, pool, live, ref_params) -> algorithms.Context:
    """What the method may use: the model's graph, the policy optimizer, batching, and
    `play` (episodes with the current policy from a given sampler key)."""
    c = self.cfg

    def play(tasks, play_key):
      policy = SamplerPolicy(graphdef, live.params, self.tok, c, greedy=False,
                             key=play_key, mesh=live.mesh)
      return rollout_lib.run_episodes(pool, policy, self.tok, tasks, c.rollout,
                                      np.random.default_rng(0), fmt=self.fmt)

    return algorithms.Context(
        cfg=c, graphdef=graphdef, tx=tx, sampling_cfg=sampling_config(c, self.tok, greedy=False),
        # Each process batches its own rows, as many batches as every other process;
        # their packed layouts would differ, so several processes train on unpacked rows.
        batches=lambda rows, bs, *, seed, epochs: self._batches(
            *dist.local_rows(rows, bs, self.mesh, data_lib.empty_row(self.tok.pad_id)),
            seed=seed, epochs=epochs, phase="rl",
            pack=self.cfg.optim.pack_rows and not dist.multi()),
        to_device=lambda batch: dist.to_device(batch, self.mesh), pad_id=self.tok.pad_id,
        play=play, workdir=self.workdir, ref_params=ref_params, perf=self.perf)

  def _restore(self, state) -> tuple[Any, dict]:
    # Before any array is read: a checkpoint of another process count is not damage.
    wrote = int(self.ckpt.read_meta().get("processes", 1))
    if wrote != dist.process_count():
      raise CheckpointError(
          f"--resume: the checkpoint in {self.ckpt.directory} was written by {wrote} "
          f"process(es) and this run has {dist.process_count()}; resume with {wrote} (each "
          "process plays its own share of the task groups with its own sampler stream)")
    tree, meta = self.ckpt.restore(algorithms.pack_state(state, self.aux))
    state, self.aux = algorithms.unpack_state(tree, self.aux)
    self.env_steps = int(meta["env_steps"])
    self.np_rng.bit_generator.state = meta["np_rng"]
    # Absent in checkpoints written before the counts were kept.
    self.pack_counts = {k: list(v) for k, v in meta.get("pack_counts", {}).items()}
    self.summary = meta["summary"]
    self.guard.load(meta["nonfinite"])
    self.policies["rollout"].set_key_state(
        meta["rollout_keys"][dist.process_index()] if dist.multi() else meta["rollout_key"])
    # Iterations logged after the checkpoint are replayed; drop their old lines.
    self.writer.drop_after(int(meta["iteration"]))
    print(f"resumed from {self.ckpt.directory} at {meta['phase']} "
          f"iteration {meta['iteration']}")
    return state, meta


def summary_table(summary: dict[str, Any], split: str) -> str:
  """A Markdown table of the held-out evaluations (greedy and sampled where run)."""
  cols = [("eval", "greedy"), ("eval_sampled", "sampled")]
  present = [(p, n) for p, n in cols if any(f"{p}/success" in m for m in summary.values())]
  head = ["policy"] + [f"{split} success ({n})" for _, n in present] + \
         [f"mean length ({n})" for _, n in present] + ["episodes"]
  rows = [head]
  for name, key in (("SFT", "sft"), ("SFT + RL", "rl")):
    if key in summary:
      m = summary[key]
      rows.append([name] + [f"{m[f'{p}/success']:.3f}" for p, _ in present] +
                  [f"{m[f'{p}/episode_len']:.2f}" for p, _ in present] +
                  [f"{int(m[f'{present[0][0]}/episodes'])}"])
  widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
  lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
  lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
  return "\n".join(lines)
