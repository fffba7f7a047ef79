"""The policy: how a run's model, tokenizer and prompt format are built (`build_policy`,
the one place the trainer and every post-training command build them), and the jitted
sampler (csa_jax/model/sampling.py) as a host-side policy over lists of token ids
(`SamplerPolicy`): what the rollout (csa_jax/rollout/episodes.py) calls to act, with its own
checkpointed key stream, sampling only the live rows of a call."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from csa_jax.config import ExperimentConfig
from csa_jax.distributed import mesh as mesh_lib
from csa_jax.model import Decoder, hf
from csa_jax.model import sampling
from csa_jax.model.tokenizer import Tokenizer
from csa_jax.rollout import episodes as rollout_lib
from csa_jax.rollout.prompts import PromptFormat
from csa_jax.rollout.setup_checks import SetupError
from csa_jax.update import data as data_lib


class BuiltPolicy(NamedTuple):
  tok: Tokenizer
  fmt: PromptFormat
  graphdef: Any
  params: Any  # freshly initialised (or the checkpoint's): what a restore fills


def build_policy(cfg: ExperimentConfig, mesh,
                 tokenizer: Callable[[PromptFormat], Tokenizer] | None = None
                 ) -> BuiltPolicy:
  """The run's policy as `cfg` describes it, its parameters placed on `mesh` by the
  training rules.

  With `model_path`: that Hugging Face checkpoint's weights and tokenizer, prompts in its
  chat template where it has one, and the model's remat, scan and LoRA settings (adapters
  drawn from the seed over the frozen base); `tokenizer` is not called. Else a decoder of
  `model`'s shape initialised from the seed, reading raw prompt text, with the run's own
  tokenizer: `tokenizer(fmt)` (the trainer trains it on the demonstrations, or reads back
  the one it saved; the post-training commands read the saved one). A checkpoint restores
  into what this returns, so everything that shapes the parameter tree is decided here.
  """
  if cfg.model_path:
    try:
      model, tok = hf.from_pretrained(cfg.model_path, dtype=cfg.model.dtype,
                                      param_dtype=cfg.model.param_dtype, mesh=mesh,
                                      rules=mesh_lib.TRAIN_RULES, remat=cfg.model.remat,
                                      scan_layers=cfg.model.scan_layers, lora=cfg.model.lora,
                                      seed=cfg.seed)
    except (ValueError, FileNotFoundError) as e:  # HFCheckpointError, tokenizer files
      raise SetupError(f"model_path {cfg.model_path}: {str(e).splitlines()[0]}") from None
    fmt = (PromptFormat.chat(tok, cfg.rollout.action_format, cfg.rollout.system_prompt)
           if tok.chat_template
           else PromptFormat(action_prefix=" ", action_format=cfg.rollout.action_format))
  else:
    fmt = PromptFormat(action_format=cfg.rollout.action_format)
    tok = tokenizer(fmt)
    if tok.vocab_size > cfg.model.vocab_size:
      raise SetupError(f"tokenizer has {tok.vocab_size} tokens, model.vocab_size is "
                       f"{cfg.model.vocab_size}")
    model = Decoder(cfg.model, rngs=nnx.Rngs(cfg.seed))
    mesh_lib.shard_model(model, mesh, mesh_lib.TRAIN_RULES)
  graphdef, params = nnx.split(model, nnx.Param)
  return BuiltPolicy(tok, fmt, graphdef, params)


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
    self._shapes, self._share_prefix = cfg.rollout.sampler_shapes, cfg.rollout.share_prefix
    self.key = key

  def __call__(self, prompts: list[list[int]], rng: np.random.Generator):
    return self.collect(self.dispatch(prompts, rng))

  def dispatch(self, prompts: list[list[int]], rng: np.random.Generator
               ) -> sampling.SampleOutput:
    """Starts sampling and returns at once (JAX dispatch is asynchronous): the arrays
    are ready when `collect` reads them (rollout.overlap steps environments meanwhile)."""
    del rng  # the sampler's randomness comes from its own jax key stream
    groups = self.sampler_groups(prompts)
    self.key, sub = jax.random.split(self.key)
    model = nnx.merge(self._graphdef, self._get_params())
    parts = []
    for g, (slots, rows, width) in enumerate(groups):
      # Rows beyond the live ones repeat the first (one shared prefill; a call of dummies
      # alone samples one of them); their answers are dropped.
      first = slots[0] if slots else 0
      chosen = slots + [first] * (rows - len(slots))
      tokens, mask = sampling.left_pad([prompts[i] for i in chosen], self._tok.pad_id,
                                       bucket=width)
      out = sampling.sample(model, jnp.asarray(tokens), jnp.asarray(mask),
                            rng=sub if g == 0 else jax.random.fold_in(sub, g),
                            cfg=self._scfg, pad_id=self._tok.pad_id, mesh=self._mesh,
                            prefill_chunk=self._prefill_chunk,
                            share_prefix=self._share_prefix)
      parts.append((out, slots))
    return parts, len(prompts)

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
    rows = next(r for r in (-(-n // d // self._data) * self._data for d in (4, 2, 1))
                if r >= live)
    return rows, sampling.bucket_length(max(map(len, prompts)), self._bucket)

  @property
  def _data(self) -> int:
    return 1 if self._mesh is None else self._mesh.shape["data"]

  def sampler_groups(self, prompts: list[list[int]]) -> list[tuple[list[int], int, int]]:
    """The batches the sampler runs for `prompts`: (the slots each samples, its rows, its
    prompt width), by rollout.sampler_shapes: one batch of `sampler_shape`, or ("fit")
    `fit_groups` of the live prompts (none when no prompt is live). The rollout counts
    padding with these."""
    live = self._live(prompts)
    if self._shapes == "bucket":
      return [(live, *self.sampler_shape(prompts))]
    return [([live[j] for j in idx], rows, width) for idx, rows, width in fit_groups(
        [len(prompts[i]) for i in live], self._bucket, self._scfg.max_new_tokens, self._data)]

  @staticmethod
  def collect(pending) -> tuple[list[list[int]], list[list[float]]]:
    """The answers of `dispatch`'s call, one per prompt it was given (empty for the rows it
    did not sample)."""
    parts, n = pending
    got_ids, got_logps = [[] for _ in range(n)], [[] for _ in range(n)]
    for out, slots in parts:
      ids, logps, lens = (np.asarray(out.tokens_BxN), np.asarray(out.logprobs_BxN),
                          np.asarray(out.lengths_B))
      for row, i in enumerate(slots):
        got_ids[i] = ids[row, :lens[row]].tolist()
        got_logps[i] = logps[row, :lens[row]].tolist()
    return got_ids, got_logps

  # The key as JSON (the checkpoint's meta) and back.
  def key_state(self) -> list[int]:
    return np.asarray(jax.random.key_data(self.key)).tolist()

  def set_key_state(self, data: list[int]) -> None:
    self.key = jax.random.wrap_key_data(np.asarray(data, np.uint32))


# A decode step reads every weight whatever its rows: on a CPU a batch of fewer rows than
# this costs about as much per step as one of this many (`fit_groups`' cost model; with
# SmolLM2-135M on 2 cores a decode step of 16 rows took as long as a prefill of about 75
# prompt tokens).
DECODE_ROWS_FREE = 64
# fit_groups splits a call only where that saves at least this share of its work (each
# new batch shape compiles once).
SPLIT_MIN_GAIN = 1 / 8


def fit_groups(lengths: list[int], budget: int, new_tokens: int, multiple: int = 1,
               max_groups: int = 3) -> list[tuple[list[int], int, int]]:
  """Prompts of these lengths in up to `max_groups` batches: (their indices, rows, width).

  The prompts are sorted by length and cut into runs; a run's rows are its count and its
  width its longest prompt, each rounded up to one of 8 evenly spaced sizes per doubling
  (data.round_up_count: at most 1/8 padding; rows then to a multiple of `multiple`, the
  width at most `budget`). The cut minimises the estimated work, rows x width of prefill
  plus new_tokens decode steps of max(rows, DECODE_ROWS_FREE) rows each, and a call is
  split only where that saves SPLIT_MIN_GAIN of one batch's work."""
  if not lengths:
    return []
  order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))

  def shape(i, j):  # the sorted run [i, j)
    rows = -(-data_lib.round_up_count(j - i) // multiple) * multiple
    return rows, min(max(data_lib.round_up_count(lengths[order[j - 1]]), 1), budget)

  def cost(i, j):
    rows, width = shape(i, j)
    return rows * width + new_tokens * max(rows, DECODE_ROWS_FREE)

  n = len(order)
  # best[k][j]: the least work of the first j prompts in k runs, and where the last begins.
  best = [{0: (0.0, 0)}] + [{} for _ in range(max_groups)]
  for k in range(1, max_groups + 1):
    for j in range(1, n + 1):
      options = [(best[k - 1][i][0] + cost(i, j), i) for i in range(j) if i in best[k - 1]]
      if options:
        best[k][j] = min(options)
  one = best[1][n][0]
  k = min((k for k in range(1, max_groups + 1) if n in best[k]),
          key=lambda k: (best[k][n][0] if k == 1 or best[k][n][0] <= (1 - SPLIT_MIN_GAIN) * one
                         else float("inf"), k))
  cuts, j = [], n
  for kk in range(k, 0, -1):
    i = best[kk][j][1]
    cuts.append((i, j))
    j = i
  return [([order[x] for x in range(i, j)], *shape(i, j)) for i, j in reversed(cuts)]
