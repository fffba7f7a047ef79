"""Held-out evaluation (csa_jax/rollout/evaluation.py): the oracle action's exact probability is
the product of the sampling distribution's token probabilities of that action after the
first step's prompt, computed here from the model's full logits."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from csa_jax.rollout import prompts
from csa_jax.config import (EnvConfig, EvalConfig, ExperimentConfig, RolloutConfig)
from csa_jax.model import Decoder, ModelConfig
from csa_jax.model.tokenizer import train_bpe
from csa_jax.rollout.evaluation import OracleProbs
from csa_jax.rollout.policy import sampling_config
from environments import faulty  # noqa: F401  (registers "faulty")
from environments import make_env

PROMPT, ACT = 48, 6


def _setup(temperature):
  cfg = ExperimentConfig(
      env=EnvConfig(name="keydoor", kwargs={"horizon": 2, "num_keys": 4}),
      rollout=RolloutConfig(max_turns=3, max_prompt_tokens=PROMPT, max_action_tokens=ACT,
                            temperature=temperature),
      eval=EvalConfig(num_episodes=70, oracle_prob=True))  # two passes of 64 rows
  env = make_env("keydoor", horizon=2, num_keys=4)
  texts = []
  for i in range(20):
    r = env.reset("train", i)
    texts += [r.info.task, r.observation, " | ".join(r.info.admissible_actions)]
  tok = train_bpe(texts + ["Task: Now: Actions: Action: > |"], 300)
  model = Decoder(ModelConfig.tiny(512, hidden_size=16, intermediate_size=32, num_layers=1,
                                   num_heads=2, num_kv_heads=1, head_dim=8,
                                   max_seq_len=PROMPT + ACT), rngs=nnx.Rngs(3))
  graphdef, params = nnx.split(model, nnx.Param)
  return cfg, env, tok, model, graphdef, params


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_oracle_probability_is_the_actions_token_probability_product(temperature):
  cfg, env, tok, model, graphdef, params = _setup(temperature)
  scfg = sampling_config(cfg, tok, greedy=False)
  oracle = OracleProbs(graphdef, tok, cfg, prompts.PLAIN, scfg)
  got = oracle(params)
  assert got.shape == (70,)
  np.testing.assert_array_equal(oracle(params, 10), got[:10])
  for i in (0, 33, 69):
    r = env.reset("test", i)
    prompt = prompts.encode_prompt(tok, r.info.task, [], r.observation,
                                   r.info.admissible_actions, history_turns=1,
                                   max_tokens=PROMPT)
    # The answer as the policy writes it: a space after the "Action:" cue, then the end.
    action = tok.encode(f" take {env._task['key']} key") + [tok.eos_id]
    seq = np.asarray([prompt + action[:-1]], np.int32)
    logits = np.asarray(jax.jit(lambda x: model(x))(seq), np.float64)[0] / temperature
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                             keepdims=True)) \
        - logits.max(-1, keepdims=True)
    want = np.exp(sum(logp[len(prompt) - 1 + k, a] for k, a in enumerate(action)))
    assert got[i] == pytest.approx(want, rel=1e-4)
  recs = oracle.records(got[:2], 8)
  assert recs[1] == {"step": 8, "policy": "eval_oracle", "split": "test", "index": 1,
                     "prob": float(got[1])}


def test_an_environment_without_an_oracle_action_is_refused():
  """KeyDoor behind the fault-injection wrapper, which names no oracle action."""
  cfg, _, tok, _, graphdef, _ = _setup(1.0)
  cfg = dataclasses.replace(cfg, env=EnvConfig(
      name="faulty", kwargs={"inner": "keydoor", "inner_kwargs": {"horizon": 2}}))
  with pytest.raises(ValueError, match="names no oracle action"):
    OracleProbs(graphdef, tok, cfg, prompts.PLAIN, sampling_config(cfg, tok, greedy=False))
