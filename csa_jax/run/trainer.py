"""The host loop: demonstrations -> tokenizer -> SFT -> RL with group advantages -> eval.

A run is four phases (`Trainer._run`): the policies (tokenizer, model, train state,
samplers; restored on a resume), SFT and its held-out evaluation, the RL loop, and the
final evaluation. One RL iteration: B tasks x G copies are played by the environment pool
against the jitted sampler; the episodes become padded [B, G, T] arrays; a jitted
estimator (CSA by default) turns them into per-step advantages; a grain pipeline turns
steps into fixed-shape rows; the jitted clipped update runs over them. After it run the
hooks due at its number, as Levanter's trainer hooks do: the held-out evaluation
(`eval.every`), the metrics line (every iteration), the checkpoint (`checkpoint_every`).
Everything a run saves lives under the work directory; its checkpoints make a crashed run
resumable with `--resume`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from csa_jax import algorithms
from csa_jax import credit
from csa_jax import perf as perf_lib
from csa_jax import provenance
from csa_jax import workdir as workdir_lib
from csa_jax.config import ExperimentConfig, micro_batches, to_dict
from csa_jax.distributed import mesh as mesh_lib
from csa_jax.distributed import processes as dist
from csa_jax.model.tokenizer import Tokenizer, train_bpe
from csa_jax.rollout import episodes as rollout_lib
from csa_jax.rollout import groups
from csa_jax.rollout import metrics as metrics_lib
from csa_jax.rollout.evaluation import HeldOut
from csa_jax.rollout.policy import BuiltPolicy, SamplerPolicy, build_policy, sampling_config
from csa_jax.rollout.setup_checks import SetupError, check_budgets, check_processes
from csa_jax.rollout.sft_rows import demo_corpus, demo_rows, load_demos
from csa_jax.run import loggers
from csa_jax.run import sft_progress
from csa_jax.run.checkpoint import Checkpointer, CheckpointError
from csa_jax.run.signals import Interrupted, StopOnSignal
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts
from csa_jax.update.guard import NonFiniteGuard
from environments.pool import EnvPool


@dataclasses.dataclass
class Trainer:
  cfg: ExperimentConfig
  workdir: str
  resume: bool = False

  def __post_init__(self):
    c = self.cfg
    if self.resume and not workdir_lib.resumable(self.workdir):
      where = os.path.abspath(os.path.join(self.workdir, workdir_lib.CHECKPOINTS))
      raise CheckpointError(f"--resume: no checkpoint in {where}")
    os.makedirs(self.workdir, exist_ok=True)
    self.mesh = mesh_lib.make_mesh(c.mesh)
    self.algo = algorithms.get(c.algo.method)
    check_processes(c, self.algo)
    try:
      # The parameters the samplers read: the training ones, or with several processes a
      # copy on this process's devices, refreshed after every update.
      self.live = dist.SamplerMesh(self.mesh)
    except ValueError as e:  # a 'model' axis across hosts
      raise SetupError(str(e)) from None
    self.ckpt = Checkpointer(os.path.join(self.workdir, workdir_lib.CHECKPOINTS))
    # A checkpoint of another process count is refused before anything is built or read.
    wrote = self.resume and self.ckpt.latest_step() is not None and int(
        self.ckpt.read_meta()["processes"])
    if wrote and wrote != dist.process_count():
      self.ckpt.close()
      raise CheckpointError(
          f"--resume: the checkpoint in {self.ckpt.directory} was written by {wrote} "
          f"process(es) and this run has {dist.process_count()}; resume with {wrote} (each "
          "process plays its own share of the task groups with its own sampler stream)")
    self.sft_ckpt = Checkpointer(os.path.join(self.workdir, workdir_lib.SFT), max_to_keep=1)
    if dist.is_writer():
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        json.dump(to_dict(c) | {"provenance": provenance.record()}, f, indent=2)
    self.writer = loggers.open_for(c, self.workdir)
    self.np_rng = np.random.default_rng(c.seed)
    self.aux: Any = {}  # the method's auxiliary state (models, optimizer states)
    self.env_steps = 0
    # The packed sequence counts (per micro-batch) each phase ("sft", "rl") has compiled
    # an update for: `_batches`.
    self.pack_counts: dict[str, list[int]] = {}
    # The shared-prefix lengths (optim.share_prefix) each phase has compiled an update for.
    self.prefix_lens: dict[str, list[int]] = {}
    self.summary: dict[str, Any] = {}
    self.guard = NonFiniteGuard(c.optim.max_nonfinite_in_a_row)
    self.stop = StopOnSignal()
    self.perf = perf_lib.Timer()  # where each RL iteration's time goes (perf/ metrics)
    self.save_s = 0.0  # the save that ended the last RL iteration (perf/checkpoint_s)
    # Built as the run starts (`_start_policies`, `_rl_phase`): the environment pool; the
    # policy's tokenizer, prompt format, model graph and optimizer; the KL anchor; what the
    # method may use (`_context`); the RL loop's progress bar.
    self.pool = self.tok = self.fmt = self.graphdef = self.tx = None
    self.ref_params = self.ctx = self.bar = None
    self.rollout_policy: SamplerPolicy | None = None
    self.held_out: HeldOut | None = None  # the held-out evaluations' policies and keys

  # -- set-up --------------------------------------------------------------------------

  def _policy(self) -> tuple[list | None, BuiltPolicy]:
    """(demonstrations, the run's policy: `build_policy`). From scratch, the tokenizer is
    `sft.init_from`'s (then no demonstrations are read), the one saved here (a resume: the
    ids must stay the ones trained on), or a byte-level BPE trained on the demonstrations."""
    c = self.cfg
    path = os.path.join(self.workdir, "tokenizer.json")
    if c.model_path:  # loaded first: a bad model directory fails before demos are built
      policy = build_policy(c, self.mesh, tokenizer=None)
      return (None if c.sft.init_from else load_demos(c)), policy
    records = None if c.sft.init_from else load_demos(c)
    if c.sft.init_from and not os.path.exists(path):
      shutil.copy(os.path.join(c.sft.init_from, "tokenizer.json"), path)

    def load_or_train(fmt):
      if os.path.exists(path):
        return Tokenizer.load(path)
      tok = train_bpe(demo_corpus(records, fmt), c.tokenizer.vocab_size)
      tok.save(self.workdir)
      return tok

    # Process 0 trains and saves it; the others read that file (the same ids everywhere).
    policy = build_policy(c, self.mesh, lambda fmt: dist.first_then_rest(
        lambda: load_or_train(fmt), "tokenizer"))
    return records, policy

  def _start_policies(self) -> tuple[list | None, Any, dict]:
    """(demonstrations, train state, checkpoint meta): the policy, its optimizer and
    samplers, restored from the newest checkpoint when resuming one."""
    c = self.cfg
    records, (self.tok, self.fmt, self.graphdef, params) = self._policy()
    check_budgets(c, self.tok, self.fmt, self.pool, records)
    self.tx = ts.make_optimizer(c.optim)
    state = ts.placed_state(params, self.tx, self.mesh)
    self.aux = self.algo.init_aux(c, state.params)  # also the template to restore into
    self.live.update(state.params)
    key = jax.random.key(c.seed)
    # Rollouts sample at the rollout temperature (key 1); held-out evaluation with keys of
    # its own (2, 3).
    self.rollout_policy = SamplerPolicy(
        self.graphdef, self.live.params, self.tok, c, greedy=False,
        key=dist.process_key(jax.random.fold_in(key, 1)), mesh=self.live.mesh)
    self.held_out = HeldOut(self.graphdef, self.live, self.tok, c, self.fmt, key, self.writer)
    meta = {"phase": "start", "iteration": 0}
    if self.resume and self.ckpt.latest_step() is not None:  # else SFT's progress, if any
      state, meta = self._restore(state)
      self.live.update(state.params)
      if (meta["phase"] == "done" and c.rl_iterations > int(meta["iteration"])
          and not self._budget_spent()):
        meta["phase"] = "rl"  # a finished run extended with a larger rl_iterations
    return records, state, meta

  # -- phases --------------------------------------------------------------------------

  def _sft(self, params, records) -> Any:
    """Behaviour cloning; sft/nll every `log_every` batches (a curve in TensorBoard at the
    batch number). Stopped by a signal, it saves its progress (csa_jax/run/sft_progress.py),
    which `--resume` continues from."""
    c = self.cfg
    rows = demo_rows(records, self.tok, c, self.fmt)
    ds = self._batches(rows, c.sft.batch_size, seed=c.seed, epochs=c.sft.epochs, phase="sft")
    tx = ts.make_optimizer(c.optim, learning_rate=c.sft.learning_rate)
    state = ts.placed_state(params, tx, self.mesh)
    step = ts.make_sft_step(self.graphdef, tx, micro_batches(c.optim, c.sft.batch_size))
    metrics, tokens, start, total = {}, np.zeros(2), 0, len(ds)
    if sft_progress.exists(self.workdir):
      state, meta = sft_progress.restore(self.workdir, state)
      start, tokens = int(meta["batch"]), np.asarray(meta["tokens"], np.float64)
      self.guard.load(meta["nonfinite"])
      print(f"SFT continues at batch {start + 1} of {total} "
            f"({sft_progress.directory(self.workdir)})")
    # Curve lines of an abandoned attempt past this point would repeat.
    self.writer.keep(lambda r: r.get("sft/batch", start + 1) <= start)
    per_epoch = max(total // max(c.sft.epochs, 1), 1)
    with tqdm(total=total, initial=start, desc="sft", unit="batch") as bar:
      for i, batch in enumerate(data_lib.iterate(ds)):
        if i < start:  # done before the stop: the same seeded order, skipped
          continue
        tokens += data_lib.token_counts(batch, micro_batches(c.optim, c.sft.batch_size))
        state, metrics = step(state, dist.to_device(batch, self.mesh, whole=True))
        self.guard.observe(metrics, f"SFT batch {i + 1}")
        if (i + 1) % c.log_every == 0 or i + 1 == total:
          self.writer.write(0, {"sft/nll": float(metrics["nll"]), "sft/batch": i + 1,
                                "sft/epoch": i / per_epoch}, tb_step=i + 1)
        requested = dist.agree_stop(self.stop.requested)
        if requested:
          saved = None
          if dist.is_writer() and not dist.multi():
            saved = sft_progress.save(self.workdir, state, {
                "batch": i + 1, "tokens": tokens.tolist(), "nonfinite": self.guard.state()})
          raise Interrupted(requested, saved, None, during=f"after batch {i + 1} of {total}")
        bar.update()
        bar.set_postfix(nll=f"{float(metrics['nll']):.3f}")
    self.writer.write(0, {f"sft/{k}": float(v) for k, v in metrics.items()} |
                      {"sft/rows": len(rows), "sft/demos": len(records),
                       "sft/pad_frac": 1.0 - tokens[0] / max(tokens[1], 1)}, tb_step=total)
    sft_progress.remove(self.workdir)
    return state.params

  def _batches(self, rows, batch_size: int, *, seed: int, epochs: int, phase: str,
               pack: bool | None = None):
    """Batches of `batch_size` rows: inputs as long as prompt + action budgets, one action
    slot per possible action token; packed (`pack`, default optim.pack_rows) into sequences
    of that length, else one row per sequence (one shape). Packed, each minibatch takes a
    sequence count the phase has compiled where one fits, or the unpacked layout where
    packing saves little (`data.reuse_count` over `pack_counts`, saved with checkpoints so
    a resumed run lays rows out as the uninterrupted one): a run compiles a few shapes.
    With optim.share_prefix, the unpacked minibatches are laid out with the prompt tokens
    every row starts with split off (`data.common_prefix_len`; a length the phase has
    compiled where the rows hold one, `data.reuse_prefix_len` over `prefix_lens`)."""
    r = self.cfg.rollout
    kw = dict(batch_size=batch_size, seq_len=r.seq_len,
              pad_id=self.tok.pad_id, seed=seed, epochs=epochs)
    if not (self.cfg.optim.pack_rows if pack is None else pack):
      return data_lib.batches(rows, action_len=r.max_action_tokens, **kw)
    kw |= dict(micro_batches=micro_batches(self.cfg.optim, batch_size),
               seq_multiple=self.mesh.shape["data"])
    compiled = self.pack_counts.setdefault(phase, [])
    per_micro = batch_size // kw["micro_batches"]
    counts = [data_lib.reuse_count(n, compiled, per_micro)
              for n in data_lib.packed_needs(rows, **kw)]
    prefix_len = 0
    if self.cfg.optim.share_prefix and 0 in counts:  # (a packed minibatch keeps its layout)
      prefix_len = data_lib.reuse_prefix_len(data_lib.common_prefix_len(rows),
                                             self.prefix_lens.setdefault(phase, []))
    return data_lib.packed_batches(rows, action_len=r.max_action_tokens, seqs_per_micro=counts,
                                   prefix_len=prefix_len, **kw)

  def _rl_iteration(self, it, pool, policy, rl_step, state, ref_params):
    t0 = time.perf_counter()
    batch, played = groups.collect(pool, policy, self.tok, self.cfg, self.np_rng, fmt=self.fmt,
                                   perf=self.perf)
    self.env_steps += dist.count_env_steps(played)
    m = {"perf/env_steps_total": self.env_steps, "perf/rollout_s": time.perf_counter() - t0}
    m |= dist.env_steps_by_process(played)
    if batch is None:  # every group uniform: nothing to learn from this round
      return state, m | {"perf/update_skipped": 1.0}
    m |= metrics_lib.gathered_episode_metrics(batch.trajs, "rollout")
    arrays = batch.arrays
    with self.perf.phase("adv"):
      prep = self.algo.prepare(self.ctx, it, batch, state.params, self.aux)
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
      m |= credit.credit_accuracy(adv_BxGxT, oracle, act)
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

  def _sft_stage(self, params, records) -> tuple[Any, dict | None, list | None]:
    """SFT parameters, and their held-out evaluation (rates, episode records) if known:
    from workdir/sft (a run stopped right after its SFT stage), from `sft.init_from`, or
    cloned here from the demonstrations (evaluation None)."""
    c = self.cfg
    sources = [self.sft_ckpt]
    if c.sft.init_from:
      sources.append(Checkpointer(os.path.join(c.sft.init_from, "sft"), max_to_keep=1))
    for source in sources:
      if source.latest_step() is not None:
        params, meta = source.restore(params)
        print(f"SFT parameters from {source.directory}")
        return params, meta["sft_eval"], meta["sft_episodes"]
    if c.sft.init_from:
      raise CheckpointError(f"sft.init_from: no SFT checkpoint in {c.sft.init_from}/sft")
    return self._sft(params, records), None, None

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
    (`Interrupted`); whatever ends it, the metrics are flushed and pending saves finish."""
    c = self.cfg
    try:
      with self.stop, EnvPool(c.env.name, dict(c.env.kwargs), c.rollout.num_envs,
                              backend=c.env.pool_backend,
                              step_timeout_s=c.rollout.step_timeout_s) as self.pool:
        self._run()
    finally:
      self.ckpt.close()
      self.sft_ckpt.close()
      self.writer.close()
    if dist.is_writer():
      loggers.plot_learning_curve(self.writer.path,
                                  os.path.join(self.workdir, "learning_curve.png"),
                                  title=f"{c.name}: {algorithms.label(c.algo)}")
    return self.summary

  def _run(self) -> None:
    records, state, meta = self._start_policies()
    if meta["phase"] == "start":
      state = self._sft_phase(state, records)
      meta = {"phase": "rl", "iteration": 0}
    state, last = self._rl_phase(state, int(meta["iteration"]))
    if self.cfg.rl_iterations > 0 and meta["phase"] != "done":
      self._final_evaluation(state, last)

  def _sft_phase(self, state, records):
    """The SFT parameters (`_sft_stage`) and their held-out evaluation; the train state
    RL starts from, checkpointed as iteration 0."""
    c = self.cfg
    params, m, episodes = self._sft_stage(state.params, records)
    state = ts.placed_state(params, self.tx, self.mesh)
    self.aux = self.algo.init_aux(c, state.params)
    self.live.update(state.params)
    if m is None:
      m, episodes = self.held_out(self.pool, "SFT", 0)
    else:  # an SFT start's copied evaluation: its oracle probabilities too
      m = m | self.held_out.oracle_probs(0)
    # workdir/sft: the KL reference, and the start of any run naming this one in
    # `sft.init_from` (which copies its evaluation, episodes included).
    if self.sft_ckpt.latest_step() is None:
      self.sft_ckpt.save(0, state.params, {"sft_eval": m, "sft_episodes": episodes})
      self.sft_ckpt.wait()
    self.summary["sft"] = m
    self.writer.episodes(episodes)
    self.writer.write(0, m | {"perf/env_steps_total": 0})
    self._save(0, state, {"phase": "rl", "iteration": 0})
    return state

  def _rl_phase(self, state, start: int) -> tuple[Any, int]:
    """RL iterations from `start` until rl_iterations or the env-step budget; after each,
    the hooks due at its number. (train state, the last iteration done)."""
    c = self.cfg
    self.ref_params = self._kl_reference(state.params)
    self.ctx = self._context()
    rl_step = self.algo.make_step(self.ctx)
    hooks = ((c.eval.every, self._eval_hook), (1, self._log_hook),
             (c.checkpoint_every, self._checkpoint_hook))
    last = start
    with tqdm(total=c.rl_iterations, initial=start, desc=f"rl ({algorithms.label(c.algo)})",
              unit="it") as self.bar:
      for it in range(start, c.rl_iterations):
        if self._budget_spent():
          break
        requested = dist.agree_stop(self.stop.requested)
        if requested:  # during SFT's evaluation or a resume: `it` is saved
          raise Interrupted(requested, self.ckpt.directory, it)
        self.perf.reset(checkpoint_s=self.save_s)
        self.save_s = 0.0
        state, m = self._rl_iteration(it, self.pool, self.rollout_policy, rl_step, state,
                                      self.ref_params)
        self.live.update(state.params)
        last = it + 1
        for every, hook in hooks:
          if every and last % every == 0:
            hook(last, state, m)
        requested = dist.agree_stop(self.stop.requested)
        if requested:
          if last % c.checkpoint_every:  # not saved by its hook
            self._checkpoint_hook(last, state, m)
          raise Interrupted(requested, self.ckpt.directory, last)
    return state, last

  # Hooks: (iteration just done, train state, its metrics line, which a hook may extend).

  def _eval_hook(self, it: int, state, m: dict) -> None:
    """A held-out evaluation (eval.every) before the last iteration's, which is final."""
    del state  # the samplers read the live parameters
    if it < self.cfg.rl_iterations:
      with self.perf.phase("eval"):
        em, episodes = self.held_out(self.pool, f"it {it}", it, every=True)
      m |= em
      self.writer.episodes(episodes)

  def _log_hook(self, it: int, state, m: dict) -> None:
    """The iteration's metrics line, with where its time went."""
    del state
    timing = self.perf.metrics()
    # Environment steps turned into an update, per second of the whole iteration.
    m |= timing | {"perf/env_steps_per_s": m.get("rollout/env_steps", 0.0)
                   / max(timing["perf/iteration_s"], 1e-9)}
    self.writer.write(it, m)
    self.bar.update()
    self.bar.set_postfix(success=f"{m.get('rollout/success', float('nan')):.2f}",
                         steps=self.env_steps)

  def _checkpoint_hook(self, it: int, state, m: dict) -> None:
    del m
    t0 = time.perf_counter()
    self._save(it, state, {"phase": "rl", "iteration": it})
    self.save_s = time.perf_counter() - t0

  def _final_evaluation(self, state, last: int) -> None:
    m, episodes = self.held_out(self.pool, "RL", last)
    self.writer.episodes(episodes)
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
                   "rollout_key": self.rollout_policy.key_state(),
                   "processes": dist.process_count(), "pack_counts": self.pack_counts,
                   "prefix_lens": self.prefix_lens}
    if self.cfg.model.lora.enabled:  # the checkpoint holds the adapters; this, the base
      meta["lora_base"] = self.cfg.model_path or f"from scratch, seed {self.cfg.seed}"
    if dist.multi():  # each process's own sampler stream; the meta is process 0's
      keys = dist.gather_concat(np.asarray(self.rollout_policy.key_state(), np.uint32))
      meta["rollout_keys"] = keys.reshape(dist.process_count(), -1).tolist()
    self.ckpt.save(step, algorithms.pack_state(state, self.aux),
                   json.loads(json.dumps(meta, default=float)))

  def _context(self) -> algorithms.Context:
    """What the method may use: the model's graph, the policy optimizer, batching, and
    `play` (episodes with the current policy from a given sampler key)."""
    c = self.cfg

    def play(tasks, play_key):
      policy = SamplerPolicy(self.graphdef, self.live.params, self.tok, c, greedy=False,
                             key=play_key, mesh=self.live.mesh)
      return rollout_lib.run_episodes(self.pool, policy, self.tok, tasks, c.rollout,
                                      np.random.default_rng(0), fmt=self.fmt)

    return algorithms.Context(
        cfg=c, graphdef=self.graphdef, tx=self.tx,
        sampling_cfg=sampling_config(c, self.tok, greedy=False),
        # Each process batches its own rows, as many batches as every other process;
        # their packed layouts would differ, so several processes train on unpacked rows.
        batches=lambda rows, bs, *, seed, epochs: self._batches(
            *dist.local_rows(rows, bs, self.mesh, data_lib.empty_row(self.tok.pad_id)),
            seed=seed, epochs=epochs, phase="rl",
            pack=self.cfg.optim.pack_rows and not dist.multi()),
        to_device=lambda batch: dist.to_device(batch, self.mesh), pad_id=self.tok.pad_id,
        play=play, workdir=self.workdir, ref_params=self.ref_params, perf=self.perf)

  def _restore(self, state) -> tuple[Any, dict]:
    tree, meta = self.ckpt.restore(algorithms.pack_state(state, self.aux))
    state, self.aux = algorithms.unpack_state(tree, self.aux)
    self.env_steps = int(meta["env_steps"])
    self.np_rng.bit_generator.state = meta["np_rng"]
    self.pack_counts = {k: list(v) for k, v in meta["pack_counts"].items()}
    # (absent from checkpoints written before optim.share_prefix)
    self.prefix_lens = {k: list(v) for k, v in meta.get("prefix_lens", {}).items()}
    self.summary = meta["summary"]
    self.guard.load(meta["nonfinite"])
    self.rollout_policy.set_key_state(
        meta["rollout_keys"][dist.process_index()] if dist.multi() else meta["rollout_key"])
    # Iterations logged after the checkpoint are replayed; drop their old lines.
    self.writer.drop_after(int(meta["iteration"]))
    print(f"resumed from {self.ckpt.directory} at {meta['phase']} "
          f"iteration {meta['iteration']}")
    return state, meta
