"""SmolLM2-135M-Instruct (the packaged model) on this machine: our sampler, LoRA update and
RL iteration, each beside its reference measured in the same run.

    python -m benchmarks.real_model --part sampler     # vs transformers' generate
    python -m benchmarks.real_model --part decode      # our prefill and decode step apart
    python -m benchmarks.real_model --part update      # vs a transformers + peft LoRA step
    python -m benchmarks.real_model --part iteration   # an RL iteration of keydoor_h4_smollm2_csa

Every part loads its experiments as launch.py does (`experiments.get_experiment`, the
overrides, `pretrained.resolve`, which imports the packaged GGUF into the cache on first
use) and builds the policy with `policy.build_policy`; the references load the same
Hugging Face directory with transformers, in float32, on as many torch threads as this
process has cores (XLA's CPU client uses them all).

sampler: 32 chat prompts, the first 16 steps of the expert demonstrations of
  `keydoor_h4_smollm2` and of `alfworld_smollm2`, each rendered by its preset's prompt
  builder (chat template, system message, budget). Ours: `policy.SamplerPolicy` of the
  ALFWorld preset (its budgets hold both; the rollout's own path: live rows, widths and
  shapes as `rollout.sampler_shapes` picks them), greedy, `--new` tokens at most, stopping
  at the end token. Transformers: `generate` on the 32 prompts left-padded in one batch,
  greedy, the same `max_new_tokens` and end token. Tokens/s count each side's generated
  tokens (up to and including the end token); a warm-up call first (ours compiles). The
  greedy tokens are compared position by position over the slots either side generated.
  Last line: `sampler ratio: R.RRx (ours N tok/s, transformers M tok/s), greedy tokens
  equal: E.E%`.

decode: `sampling.sample` (the policy's jitted sampler, without SamplerPolicy's grouping) on
  --rows random prompts of --width tokens, greedy, with 2 and with --new new tokens: the
  first is the prefill (its GFLOP/s printed), the difference a decode step. Last line:
  `decode step: N ms for R rows (W-token prompts)`.

update: one RL minibatch of `keydoor_h4_smollm2_csa` (algo.minibatch_size rows in
  optim.micro_batch_size micro-batches, the preset's): the rows are the expert
  demonstrations' steps (prompt and action through the preset's prompt builder), with
  fixed old log-probs and advantages of +-1. Ours: `train_step.make_rl_step` (the clipped
  loss, the KL term against a reference of the same adapters, AdamW with the preset's
  clip) on the batch the trainer lays out (`data.packed_batches`, the trainer's packing
  rule, and with the preset's optim.share_prefix its shared prefix split off). Torch: the
  same model with peft LoRA adapters of the preset's rank and alpha on the same
  projections, a second adapter as the KL reference (its log-probs under no_grad), TRL's
  row layout (left-padded prompts, right-padded actions,
  `logits_to_keep` = the action slots), the same clipped loss and k3 KL averaged per
  micro-batch, `clip_grad_norm_` and AdamW. Both start from adapters whose B is zero, so
  their first losses must agree (printed). Tokens/s: the rows' real input tokens per
  second of a step (median of `--reps` after a warm-up step).
  The matmul share is our step's model FLOP/s over the FLOP/s of a jitted 2048^3 float32
  matmul measured in the same run; the step's FLOPs are counted on real tokens only: per
  token, the layers' projections forward (2 N) and backward to the activations (2 N: the
  base is frozen, no weight gradients), the reference's forward (2 N), the adapters'
  matmuls (forward, backward to activations and to their weights), causal attention over
  the row's real tokens (forward, twice that backward, and the reference's); the LM head
  at the action positions only (forward, backward, reference). With optim.share_prefix
  (the preset's) ours computes the shared prefix once a micro-batch: its share counts that
  work (the prefix once a micro-batch, every row's own tokens attending to it), and the
  GFLOP/s of the rows' whole work (what the torch reference computes) are printed beside.
  Last line: `update ratio: R.RRx (ours N tok/s, torch M tok/s), matmul share: S.SS`, with
  a shared prefix followed by `(T.TT of the rows' work)`: the rows' whole work over the
  step's time, the count of the torch reference and of an unshared step.

iteration: `keydoor_h4_smollm2_csa` at its preset through the real Trainer, with a short
  SFT (8 demonstrations, one epoch) and small evaluations so that the RL iterations
  dominate: the shares of environment, sampling and update of the steady iterations, the
  first iteration's wall time and the XLA compile time inside it (jax.monitoring), a
  steady iteration's time, and last `padding: sampler prompt P, sampler generated Q,
  train rows T` (the run's perf/*_pad_frac over the steady iterations).

Memory: each part holds one copy of the model per framework (about 0.55 GB each in
float32) plus activations of one micro-batch; under 4 GB in all.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import experiments
from benchmarks.timing import median_seconds
from csa_jax import pretrained
from csa_jax.config import apply_overrides, cache_dir, micro_batches, validate
from csa_jax.distributed import mesh as mesh_lib
from csa_jax.model import sampling
from csa_jax.model.tokenizer import Tokenizer
from csa_jax.rollout import prompts
from csa_jax.rollout.policy import SamplerPolicy, build_policy, sampling_config
from csa_jax.rollout.sft_rows import load_demos
from csa_jax.update import data as data_lib
from csa_jax.update import train_step as ts

KEYDOOR = "keydoor_h4_smollm2_csa"
ALFWORLD = "alfworld_smollm2_csa"


def load(exp: str, overrides=()) :
  """The experiment's config as launch.py resolves it (the packaged model imported)."""
  cfg = apply_overrides(validate(experiments.get_experiment(exp)), list(overrides))
  return pretrained.resolve(cfg)


def cores() -> int:
  return len(os.sched_getaffinity(0))


def torch_model(path: str):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(cores())
  return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def matmul_flops_per_s(n: int = 2048, reps: int = 5) -> float:
  """FLOP/s of a jitted n x n x n float32 matmul (median of reps, after a warm-up)."""
  a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(2), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  t = median_seconds(lambda: dot(a, b).block_until_ready(), reps, warmup=1)
  return 2.0 * n ** 3 / t


def demo_steps(cfg, tok, n: int, demos: int) -> list[tuple[list[int], list[int]]]:
  """(prompt ids, action ids with the end token) of the first n steps of the experiment's
  expert demonstrations, through its prompt builder and budget."""
  r = cfg.rollout
  fmt = prompts.PromptFormat.chat(tok, r.action_format, r.system_prompt)
  cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, num_demos=demos))
  out = []
  for rec in load_demos(cfg):
    history: list[tuple[str, str]] = []
    for t, action in enumerate(rec["actions"]):
      ids = prompts.encode_prompt(tok, rec["task"], history, rec["observations"][t],
                                  rec["admissible"][t], history_turns=r.history_turns,
                                  max_tokens=r.max_prompt_tokens, fmt=fmt)
      out.append((ids, tok.encode(fmt.answer_text(action)) + [tok.eos_id]))
      history.append((action, rec["observations"][t + 1]
                      if t + 1 < len(rec["observations"]) else ""))
      if len(out) == n:
        return out
  raise ValueError(f"{cfg.name}: {demos} demonstrations hold fewer than {n} steps")


# ---------------------------------------------------------------------------------------
# FLOPs, counted on real tokens.


def _linear_params(c) -> int:
  """Matmul parameters of one layer's projections."""
  return (c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
          + c.num_heads * c.head_dim * c.hidden_size + 3 * c.hidden_size * c.intermediate_size)


def _lora_params(c) -> int:
  """Adapter parameters of one layer (r x (in + out) per adapted projection)."""
  d, f, h, k, dh = (c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads,
                    c.head_dim)
  sizes = {"q_proj": d + h * dh, "k_proj": d + k * dh, "v_proj": d + k * dh,
           "o_proj": h * dh + d, "gate_proj": d + f, "up_proj": d + f, "down_proj": f + d}
  return sum(c.lora.rank * n for name, n in sizes.items() if c.lora.on(name))


def generate_flops(c, prompt_lens, gen_lens) -> float:
  """Forward FLOPs of generating gen_lens[i] tokens after prompts of prompt_lens[i] tokens:
  the prompt and every generated token but the last through the layers, attention over the
  real keys before each query, the LM head once per generated token."""
  linear = 2 * c.num_layers * _linear_params(c)
  per_pair = 4 * c.num_layers * c.num_heads * c.head_dim
  total = 0.0
  for m, n in zip(prompt_lens, gen_lens):
    fed = m + max(n - 1, 0)
    total += linear * fed + per_pair * fed * (fed + 1) / 2 + 2 * c.hidden_size * c.vocab_size * n
  return float(total)


def update_flops(c, rows, kl_reference: bool, prefix_len: int = 0,
                 micro_batches: int = 1) -> float:
  """A LoRA RL step's FLOPs over `rows` (module docstring); with a shared prefix of
  prefix_len tokens, as the prefixed layout computes them: the prefix once a micro-batch,
  each row's own tokens attending to it and to their own."""
  base = 2 * c.num_layers * _linear_params(c)
  adapters = 2 * c.num_layers * _lora_params(c)
  per_pair = 4 * c.num_layers * c.num_heads * c.head_dim
  head = 2 * c.hidden_size * c.vocab_size
  fwd_passes = 2 if kl_reference else 1

  def tokens(fed, pairs, actions):  # `fed` tokens through the layers, attention `pairs`
    return (fed * (base * (fwd_passes + 1) + adapters * (fwd_passes + 2))
            + per_pair * pairs * (fwd_passes + 2) + head * actions * (fwd_passes + 1))

  p = prefix_len
  total = micro_batches * tokens(p, p * (p + 1) / 2, 0)
  for r in rows:
    own = len(r["prompt_ids"]) + len(r["action_ids"]) - 1 - p
    total += tokens(own, own * p + own * (own + 1) / 2, len(r["action_ids"]))
  return float(total)


# ---------------------------------------------------------------------------------------
# sampler


def sampler_part(args) -> str:
  import torch  # pylint: disable=import-outside-toplevel
  kd, alf = load(KEYDOOR, args.set), load(ALFWORLD, args.set)
  cfg = dataclasses.replace(alf, rollout=dataclasses.replace(
      alf.rollout, max_action_tokens=args.new, num_envs=2 * args.per_preset))
  mesh = mesh_lib.make_mesh(cfg.mesh)
  tok, _, graphdef, params = build_policy(cfg, mesh)
  steps = (demo_steps(kd, tok, args.per_preset, demos=8)
           + demo_steps(alf, tok, args.per_preset, demos=4))
  prompt_ids = [p for p, _ in steps]
  policy = SamplerPolicy(graphdef, lambda: params, tok, cfg, greedy=True, key=jax.random.key(0))
  out = {}

  def ours():
    out["ours"] = policy(prompt_ids, None)

  t0 = time.perf_counter()
  ours()
  first_s = time.perf_counter() - t0
  ours_s = median_seconds(ours, args.reps)

  ref = torch_model(cfg.model_path)
  p = max(map(len, prompt_ids))
  ids = torch.full((len(prompt_ids), p), tok.pad_id, dtype=torch.long)
  mask = torch.zeros((len(prompt_ids), p), dtype=torch.long)
  for i, q in enumerate(prompt_ids):
    ids[i, p - len(q):] = torch.tensor(q)
    mask[i, p - len(q):] = 1

  def theirs():
    with torch.no_grad():
      out["hf"] = ref.generate(ids, attention_mask=mask, do_sample=False,
                               max_new_tokens=args.new, eos_token_id=tok.eos_id,
                               pad_token_id=tok.pad_id, top_p=None, top_k=None,
                               temperature=None)

  with torch.no_grad():  # warm-up: torch's first call allocates
    ref.generate(ids[:2], attention_mask=mask[:2], do_sample=False, max_new_tokens=2,
                 eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, top_p=None, top_k=None,
                 temperature=None)
  hf_s = median_seconds(theirs, args.reps)

  ours_ids = out["ours"][0]
  hf_ids = []
  for row in out["hf"][:, p:].tolist():
    n = next((i + 1 for i, t in enumerate(row) if t == tok.eos_id), len(row))
    hf_ids.append(row[:n])
  equal = slots = 0
  for a, b in zip(ours_ids, hf_ids):
    n = max(len(a), len(b))
    slots += n
    equal += sum(1 for i in range(min(len(a), len(b))) if a[i] == b[i])
  agree = equal / max(slots, 1)
  n_ours, n_hf = sum(map(len, ours_ids)), sum(map(len, hf_ids))
  c = cfg.model
  flops = generate_flops(c, list(map(len, prompt_ids)), list(map(len, ours_ids)))
  peak = matmul_flops_per_s()
  ours_tps, hf_tps = n_ours / ours_s, n_hf / hf_s
  lens = sorted(map(len, prompt_ids))
  print(f"sampler: {len(prompt_ids)} prompts ({args.per_preset} keydoor_h4_smollm2, "
        f"{args.per_preset} alfworld_smollm2) of {lens[0]}-{lens[-1]} tokens "
        f"(mean {np.mean(lens):.0f}), greedy, at most {args.new} new tokens, end token "
        f"{tok.eos_id}; {cores()} cores, torch {torch.get_num_threads()} threads")
  shapes = [(rows, width) for _, rows, width in policy.sampler_groups(prompt_ids)]
  print(f"  generated tokens: ours {n_ours}, transformers {n_hf}; our batches (rows, "
        f"width) {shapes} (rollout.sampler_shapes={cfg.rollout.sampler_shapes!r}, "
        f"share_prefix={cfg.rollout.share_prefix}); transformers ({len(prompt_ids)}, {p})")
  print(f"  ours: first call (compiles) {first_s:.1f} s, then {ours_s:.2f} s median of "
        f"{args.reps}: {flops / ours_s / 1e9:.1f} GFLOP/s")
  print(f"  transformers generate: {hf_s:.2f} s median of {args.reps}: "
        f"{flops / hf_s / 1e9:.1f} GFLOP/s")
  print(f"  useful forward FLOPs {flops / 1e9:.1f} GFLOP; float32 2048^3 matmul "
        f"{peak / 1e9:.1f} GFLOP/s")
  return (f"sampler ratio: {ours_tps / hf_tps:.2f}x (ours {ours_tps:.1f} tok/s, transformers "
          f"{hf_tps:.1f} tok/s), greedy tokens equal: {100 * agree:.1f}%")


def decode_part(args) -> str:
  """Prefill and decode apart: `sampling.sample` on --rows random prompts of --width tokens,
  greedy, with 2 and with --new new tokens; the difference over the extra steps is a decode
  step's time (the loop ends early only once every row has stopped, which the longest
  answer's length rules out)."""
  cfg = load(ALFWORLD, args.set)
  mesh = mesh_lib.make_mesh(cfg.mesh)
  tok, _, graphdef, params = build_policy(cfg, mesh)
  model = nnx.merge(graphdef, params)
  ids = np.random.default_rng(0).integers(100, 40_000, (args.rows, args.width), np.int32)
  mask = np.ones_like(ids)

  def timed(n: int) -> tuple[float, int]:
    scfg = sampling.SamplingConfig(max_new_tokens=n, greedy=True)
    out = {}

    def call():
      out["o"] = sampling.sample(model, ids, mask, rng=jax.random.key(0), cfg=scfg,
                                 pad_id=tok.pad_id)
      out["o"].tokens_BxN.block_until_ready()

    return median_seconds(call, args.reps, warmup=1), int(np.asarray(out["o"].lengths_B).max())

  short_s, _ = timed(2)
  long_s, longest = timed(args.new)
  if longest < args.new:  # every row stopped: the loop ended before its last steps
    raise SystemExit(f"decode: every row ended by {longest} of {args.new} tokens; the "
                     f"difference is not {args.new - 2} decode steps")
  step_ms = 1e3 * (long_s - short_s) / (args.new - 2)
  c = cfg.model
  prefill_flops = generate_flops(c, [args.width] * args.rows, [1] * args.rows)
  print(f"decode: {args.rows} random prompts of {args.width} tokens, scan_layers="
        f"{c.scan_layers}; {cores()} cores; the decode loop ran all {args.new} steps")
  print(f"  2 new tokens {short_s:.2f} s (its prefill's FLOPs over it: "
        f"{prefill_flops / short_s / 1e9:.1f} GFLOP/s), {args.new} new tokens {long_s:.2f} s, "
        f"median of {args.reps}")
  return f"decode step: {step_ms:.1f} ms for {args.rows} rows ({args.width}-token prompts)"


# ---------------------------------------------------------------------------------------
# update


def update_rows(cfg, tok, n: int) -> list[dict]:
  rng = np.random.default_rng(0)
  rows = []
  for p, a in demo_steps(cfg, tok, n, demos=max(8, n // 4)):
    rows.append({"prompt_ids": p, "action_ids": a, "old_logps": [-0.5] * len(a),
                 "advantage": float(rng.choice([-1.0, 1.0]))})
  return rows


def our_update(cfg, rows, reps):
  """(median seconds of a step, first loss, the compile+first step seconds)."""
  mesh = mesh_lib.make_mesh(cfg.mesh)
  tok, _, graphdef, params = build_policy(cfg, mesh)
  tx = ts.make_optimizer(cfg.optim)
  state = ts.placed_state(params, tx, mesh)
  m = micro_batches(cfg.optim, cfg.algo.minibatch_size)
  step = ts.make_rl_step(graphdef, tx, cfg.algo, sampling_config(cfg, tok, greedy=False), m)
  r = cfg.rollout
  kw = dict(batch_size=len(rows), seq_len=r.seq_len, pad_id=tok.pad_id, seed=0,
            micro_batches=m, seq_multiple=mesh.shape["data"])
  counts = [data_lib.reuse_count(k, [], len(rows) // m) for k in data_lib.packed_needs(rows, **kw)]
  prefix_len = (data_lib.reuse_prefix_len(data_lib.common_prefix_len(rows), [])
                if cfg.optim.share_prefix else 0)  # as Trainer._batches
  batch = next(data_lib.iterate(data_lib.packed_batches(
      rows, action_len=r.max_action_tokens, seqs_per_micro=counts, prefix_len=prefix_len,
      **kw)))
  real, slots = data_lib.token_counts(batch, m)
  on_device = {k: jnp.asarray(v) for k, v in batch.items()}
  ref = ts.reference_params(state.params) if cfg.algo.kl_coef else None
  ref = jax.tree.map(jnp.copy, ref)  # the update donates the state it is given
  t0 = time.perf_counter()
  state, metrics = step(state, on_device, ref)
  jax.block_until_ready(metrics)
  first_s = time.perf_counter() - t0
  first_loss = float(metrics["pg_loss"]) + cfg.algo.kl_coef * float(metrics.get("kl_ref", 0.0))
  holder = {"state": state}

  def one():
    holder["state"], mets = step(holder["state"], on_device, ref)
    jax.block_until_ready(mets)

  return (median_seconds(one, reps), first_loss, first_s,
          (real, slots, batch["inputs"].shape, prefix_len))


def torch_update(cfg, rows, tok_pad: int, reps):
  """(median seconds of a step, first loss) of the transformers + peft reference."""
  import torch  # pylint: disable=import-outside-toplevel
  import peft  # pylint: disable=import-outside-toplevel
  model = torch_model(cfg.model_path)
  lc = cfg.model.lora
  targets = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                         "down_proj") if lc.on(n)]
  pcfg = peft.LoraConfig(r=lc.rank, lora_alpha=lc.alpha, lora_dropout=0.0,
                         target_modules=targets)
  model = peft.get_peft_model(model, pcfg, adapter_name="policy")
  a = cfg.algo
  if a.kl_coef:
    model.add_adapter("ref", pcfg)
  model.set_adapter("policy")
  params = [p for n, p in model.named_parameters() if p.requires_grad]
  o = cfg.optim
  opt = torch.optim.AdamW(params, lr=o.learning_rate, betas=(o.b1, o.b2),
                          weight_decay=o.weight_decay)
  m = micro_batches(o, a.minibatch_size)

  def micro(rs):  # TRL's layout: left-padded prompts, right-padded completions
    p = max(len(r["prompt_ids"]) for r in rs)
    c = max(len(r["action_ids"]) for r in rs)
    ids = torch.full((len(rs), p + c), tok_pad, dtype=torch.long)
    att = torch.zeros((len(rs), p + c), dtype=torch.long)
    comp = torch.zeros((len(rs), c), dtype=torch.long)
    cmask = torch.zeros((len(rs), c))
    old = torch.zeros((len(rs), c))
    adv = torch.zeros((len(rs), c))
    for i, r in enumerate(rs):
      q, act = r["prompt_ids"], r["action_ids"]
      ids[i, p - len(q):p] = torch.tensor(q)
      ids[i, p:p + len(act)] = torch.tensor(act)
      att[i, p - len(q):p + len(act)] = 1
      comp[i, :len(act)] = torch.tensor(act)
      cmask[i, :len(act)] = 1
      old[i, :len(act)] = torch.tensor(r["old_logps"])
      adv[i, :len(act)] = r["advantage"]
    return ids, att, comp, cmask, old, adv, c

  # Rows as our micro-batches take them (row i to micro-batch i % m).
  micros = [micro(rows[j::m]) for j in range(m)]

  def logps(ids, att, comp, c):
    logits = model(input_ids=ids, attention_mask=att, logits_to_keep=c + 1).logits[:, :-1]
    logits = logits / cfg.rollout.temperature
    return torch.gather(logits.log_softmax(-1), 2, comp[..., None])[..., 0]

  def loss_fn(ids, att, comp, cmask, old, adv, c):
    logp = logps(ids, att, comp, c)
    if a.kl_coef:
      with torch.no_grad():
        model.set_adapter("ref")
        ref = logps(ids, att, comp, c)
        model.set_adapter("policy")
    log_ratio = torch.clamp(torch.where(cmask > 0, logp - old, 0.0), -20, 20)
    ratio = log_ratio.exp()
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - a.clip_low, 1 + a.clip_high))
    loss = aggregate(pg, cmask)
    if a.kl_coef:
      x = torch.clamp(torch.where(cmask > 0, ref - logp, 0.0), -20, 20)
      loss = loss + a.kl_coef * aggregate(x.exp() - 1 - x, cmask)
    return loss

  def aggregate(x, cmask):  # losses.aggregate
    x = x * cmask
    if a.loss_agg == "token-mean":
      return x.sum() / cmask.sum().clamp(min=1)
    count = cmask.sum(-1)
    row = {"seq-mean-token-mean": x.sum(-1) / count.clamp(min=1),
           "seq-mean-token-sum": x.sum(-1),
           "seq-mean-token-sum-norm": x.sum(-1) / cfg.rollout.max_action_tokens}[a.loss_agg]
    rows = (count > 0).float()
    return (row * rows).sum() / rows.sum().clamp(min=1)

  def one():
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for mb in micros:
      loss = loss_fn(*mb) / m
      loss.backward()
      total += float(loss)
    if o.grad_clip > 0:
      torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
    opt.step()
    return total

  model.train()
  first_loss = one()
  return median_seconds(one, reps), first_loss


def update_part(args) -> str:
  import torch  # pylint: disable=import-outside-toplevel
  cfg = load(KEYDOOR, args.set)
  if cfg.algo.dual_clip or cfg.algo.entropy_coef or cfg.algo.kl_kind != "k3":
    raise SystemExit("the torch reference implements the clipped loss without dual clip "
                     "or entropy bonus, with the k3 KL")
  tok = Tokenizer.from_hf_dir(cfg.model_path)
  rows = update_rows(cfg, tok, cfg.algo.minibatch_size)
  ours_s, ours_loss, first_s, (real, slots, shape, prefix_len) = our_update(cfg, rows,
                                                                            args.reps)
  torch_s, torch_loss = torch_update(cfg, rows, tok.pad_id, args.reps)
  tokens = sum(len(r["prompt_ids"]) + len(r["action_ids"]) - 1 for r in rows)
  flops = update_flops(cfg.model, rows, bool(cfg.algo.kl_coef))
  m = micro_batches(cfg.optim, len(rows))
  computed = update_flops(cfg.model, rows, bool(cfg.algo.kl_coef), prefix_len, m)
  peak = matmul_flops_per_s()
  share = computed / ours_s / peak
  print(f"update: {len(rows)} rows of keydoor_h4_smollm2 ({tokens} real input tokens, "
        f"{tokens / len(rows):.0f} a row), {micro_batches(cfg.optim, len(rows))} micro-batches, "
        f"LoRA rank {cfg.model.lora.rank}, KL reference {bool(cfg.algo.kl_coef)}; "
        f"{cores()} cores, torch {torch.get_num_threads()} threads")
  shared = f" after a shared prefix of {prefix_len} tokens" if prefix_len else ""
  print(f"  ours: batch {shape}{shared} ({1 - real / slots:.1%} padding), first step "
        f"(compiles) {first_s:.1f} s, then {ours_s:.2f} s median of {args.reps}: "
        f"{flops / ours_s / 1e9:.1f} GFLOP/s of the rows' work, {computed / ours_s / 1e9:.1f} "
        f"GFLOP/s of what it computes ({computed / 1e9:.1f} GFLOP)")
  print(f"  torch (transformers + peft): {torch_s:.2f} s median of {args.reps}: "
        f"{flops / torch_s / 1e9:.1f} GFLOP/s")
  print(f"  first loss: ours {ours_loss:.6f}, torch {torch_loss:.6f}")
  print(f"  step FLOPs {flops / 1e9:.1f} GFLOP; float32 2048^3 matmul {peak / 1e9:.1f} GFLOP/s")
  return (f"update ratio: {torch_s / ours_s:.2f}x (ours {tokens / ours_s:.1f} tok/s, torch "
          f"{tokens / torch_s:.1f} tok/s), matmul share: {share:.2f}"
          + (f" ({flops / ours_s / peak:.2f} of the rows' work)" if prefix_len else ""))


# ---------------------------------------------------------------------------------------
# iteration


def iteration_part(args) -> str:
  from csa_jax.rollout import metrics as M  # pylint: disable=import-outside-toplevel
  from csa_jax.run.trainer import Trainer  # pylint: disable=import-outside-toplevel
  compile_s: list[tuple[float, float]] = []  # (when it ended, seconds)

  hits: list[float] = []  # when a program came from the persistent cache

  def listener(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      compile_s.append((time.perf_counter(), duration))

  def hit(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
      hits.append(time.perf_counter())

  jax.monitoring.register_event_duration_secs_listener(listener)
  jax.monitoring.register_event_listener(hit)
  n = args.iterations
  cfg = load(KEYDOOR, ["sft.num_demos=8", "sft.epochs=1", "eval.num_episodes=8",
                       "eval.greedy=false", f"rl_iterations={n}", "checkpoint_every=1000",
                       *args.set])
  work = args.workdir or tempfile.mkdtemp(prefix="real_model_iteration_")
  starts: list[float] = []
  orig = Trainer._rl_iteration

  def timed(self, *a, **kw):
    starts.append(time.perf_counter())
    return orig(self, *a, **kw)

  Trainer._rl_iteration = timed
  try:
    t0 = time.perf_counter()
    Trainer(cfg, work).run()
    total = time.perf_counter() - t0
  finally:
    Trainer._rl_iteration = orig
  recs = [r for r in M.read_jsonl(os.path.join(work, "metrics.jsonl")) if "perf/iteration_s" in r]
  first, steady = recs[0], recs[1:]
  if not steady:
    raise SystemExit("--iterations must be at least 2 (the first compiles)")
  inside = lambda t: starts[0] <= t <= starts[0] + first["perf/iteration_s"]
  first_compile = sum(d for t, d in compile_s if inside(t))
  n_compiled, n_hits = sum(inside(t) for t, _ in compile_s), sum(map(inside, hits))
  mean = lambda k: float(np.mean([r.get(k, np.nan) for r in steady]))
  it_s = mean("perf/iteration_s")
  print(f"iteration: {cfg.name}, {cfg.rollout.tasks_per_iter} tasks x G = "
        f"{cfg.rollout.group_size}, {n} RL iterations (work directory {work}, whole run "
        f"{total:.0f} s); {cores()} cores")
  print(f"  first iteration {first['perf/iteration_s']:.1f} s, of which XLA compiles "
        f"{first_compile:.1f} s ({n_compiled} programs compiled, {n_hits} read from the "
        f"persistent cache)")
  print(f"  steady iteration {it_s:.1f} s (mean of {len(steady)}): "
        + ", ".join(f"{p} {100 * mean(f'perf/frac_{p}'):.0f}%" for p in
                    ("env", "prompt", "sample", "adv", "batch", "update", "other")))
  print(f"  sampling {mean('perf/sample_s'):.1f} s at {mean('perf/gen_tokens_per_s'):.1f} "
        f"generated tok/s; update {mean('perf/update_s'):.1f} s; environment steps "
        f"{mean('rollout/env_steps'):.0f}")
  return (f"padding: sampler prompt {mean('perf/sampler_prompt_pad_frac'):.2f}, sampler "
          f"generated {mean('perf/sampler_gen_pad_frac'):.2f}, train rows "
          f"{mean('perf/train_pad_frac'):.2f}")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--part", choices=("sampler", "decode", "update", "iteration"),
                  required=True)
  ap.add_argument("--reps", type=int, default=3, help="timed calls after the warm-up")
  ap.add_argument("--per-preset", type=int, default=16,
                  help="sampler: prompts from each preset's demonstrations")
  ap.add_argument("--new", type=int, default=16, help="sampler, decode: max new tokens")
  ap.add_argument("--rows", type=int, default=16, help="decode: prompt rows")
  ap.add_argument("--width", type=int, default=288, help="decode: prompt tokens a row")
  ap.add_argument("--iterations", type=int, default=3,
                  help="iteration: RL iterations (the first compiles)")
  ap.add_argument("--workdir", default="", help="iteration: the run's directory")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                  help="more overrides of the part's experiments (as launch.py's --set)")
  ap.add_argument("--no-compilation-cache", action="store_true",
                  help="compile everything afresh (default: launch.py's persistent cache)")
  args = ap.parse_args(argv)
  if not args.no_compilation_cache:
    print(f"persistent compilation cache: {mesh_lib.enable_compilation_cache(cache_dir('xla'))}")
  part = {"sampler": sampler_part, "decode": decode_part, "update": update_part,
          "iteration": iteration_part}
  print(part[args.part](args), flush=True)


if __name__ == "__main__":
  main()
