"""Multi-turn episodes on real pools: what each step records, waves of environments, the
think format's parsed actions, the overlapped schedule and the sampler's rows."""

import dataclasses
import zlib

import numpy as np
import pytest

from csa_jax.config import RolloutConfig
from csa_jax.model.tokenizer import train_bpe
from csa_jax.rollout import episodes as R
from csa_jax.rollout import prompts as P
from environments.pool import EnvPool
from tests import factories

TOK = factories.tokenizer()


def test_anchor_id_is_stable_and_ignores_outer_space():
  assert R.anchor_id("You are in the kitchen.") == R.anchor_id("  You are in the kitchen.\n")
  assert R.anchor_id("a") != R.anchor_id("b")
  assert 0 <= R.anchor_id("x") < 2**31


def _scripted_policy(tok, scripts):
  """A policy that plays scripts[slot][turn] in each slot (then "look around")."""
  turn = [0] * len(scripts)

  def policy(prompts, rng):
    del rng
    ids, logps = [], []
    for slot, p in enumerate(prompts):
      if p == [tok.eos_id]:  # idle slot
        ids.append([tok.eos_id])
      else:
        script = scripts[slot]
        a = script[turn[slot]] if turn[slot] < len(script) else "look around"
        turn[slot] += 1
        ids.append(tok.encode(" " + a) + [tok.eos_id])
      logps.append([-0.5] * len(ids[-1]))
    return ids, logps

  return policy


@pytest.mark.parametrize("anchor", ["state", "faithful"])
def test_gigpo_anchor_state_or_observation(anchor):
  """Two rollouts of one coin task, each sending an unknown action in a different room.

  The state anchor groups steps by room (kitchen, kitchen, pantry | kitchen, pantry,
  pantry); the faithful one (verl-agent's observation text) puts the two "Unknown action"
  steps, one in each room, into one step group.
  """
  scripts = [["dance", "move north", "look around"], ["move north", "dance", "look around"]]
  cfg = dataclasses.replace(RolloutConfig(), max_turns=3, anchor=anchor)
  with EnvPool("twx", {"game": "coin"}, 2) as pool:
    trajs = R.run_episodes(pool, _scripted_policy(TOK, scripts), TOK, [("train", 0)] * 2, cfg,
                           np.random.default_rng(0))
  ids = [[st.anchor_id for st in tr.steps] for tr in trajs]
  assert [[st.action for st in tr.steps] for tr in trajs] == scripts
  unknown = [(0, 1), (1, 2)]  # (rollout, step) that saw "Unknown action" in each room
  assert all(trajs[i].steps[t].observation.startswith("Unknown action") for i, t in unknown)
  if anchor == "state":
    kitchen, pantry = ids[0][0], ids[0][2]
    assert ids == [[kitchen, kitchen, pantry], [kitchen, pantry, pantry]] and kitchen != pantry
  else:
    assert ids[0][1] == ids[1][2]  # one step group across two rooms
    assert ids[0][1] != ids[0][0] and ids[0][1] != ids[1][1]
    assert ids[0][0] == ids[1][0] and ids[0][2] == ids[1][1]  # the same room description


def test_multi_turn_loop_plays_an_expert_on_a_real_pool():
  """Five twc tasks (deterministic expert) on two environments: waves of 2, 2 and 1.

  Results come back in task order, every episode is won, each step's observation is the
  one the agent acted on, idle and finished slots get the one-token dummy prompt, and
  every step's prompt is the one the SFT rows build for that task and step (prompts tight
  enough that some action lists are cut, so the dropped counts are checked too).
  """
  from csa_jax.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
  from csa_jax.rollout.sft_rows import demo_corpus, demo_rows  # pylint: disable=import-outside-toplevel
  from environments.demos import SEP, collect_demos  # pylint: disable=import-outside-toplevel

  env_kwargs = {"game": "twc"}
  order = [3, 0, 4, 1, 2]
  tasks = [("train", i) for i in order]
  records = collect_demos("twx", env_kwargs, "train", order)
  for rec in records:  # as the trainer reads them back
    rec["admissible"] = [a.split(SEP) for a in rec["admissible"]]
  assert all(rec["won"] for rec in records)
  tok = train_bpe(demo_corpus(records), 600)
  cfg = ExperimentConfig(rollout=RolloutConfig(max_turns=20, history_turns=2,
                                               max_prompt_tokens=160, max_action_tokens=16))
  dummy = [tok.eos_id]
  calls = []
  with EnvPool("twx", env_kwargs, 2) as pool:

    def expert(prompts, rng):
      del rng
      assert len(prompts) == pool.num_envs
      acts = pool.expert_action(list(range(pool.num_envs)))  # None once an episode ended
      calls.append([(p == dummy, a is None) for p, a in zip(prompts, acts)])
      ids = [[7, 8] if a is None else tok.encode(" " + a) + [tok.eos_id] for a in acts]
      return ids, [[-0.25] * len(x) for x in ids]

    trajs = R.run_episodes(pool, expert, tok, tasks, cfg.rollout, np.random.default_rng(0))
  assert [tr.task for tr in trajs] == tasks
  assert all(tr.won and not tr.truncated and tr.error is None for tr in trajs)
  for tr, rec in zip(trajs, records):
    assert [st.action for st in tr.steps] == rec["actions"]
    assert [st.observation for st in tr.steps] == rec["observations"]
    assert all(st.valid for st in tr.steps)
  # A slot is idle (dummy prompt) exactly when its env has no episode in play; the last
  # wave has one task, so slot 1 idles through it.
  assert all(is_dummy == ended for call in calls for is_dummy, ended in call)
  assert sum(not d for call in calls for d, _ in call) == sum(tr.length for tr in trajs)
  assert calls[-1][1] == (True, True)
  rows = demo_rows(records, tok, cfg)
  steps = [st for tr in trajs for st in tr.steps]
  assert [r["prompt_ids"] for r in rows] == [st.prompt_ids for st in steps]
  assert [r["action_ids"] for r in rows] == [st.action_ids for st in steps]
  dropped = []
  for rec in records:
    for t in range(len(rec["actions"])):
      hist = [(rec["actions"][j], rec["observations"][j + 1]) for j in range(t)]
      dropped.append(P.build_prompt(tok, rec["task"], hist, rec["observations"][t],
                                    rec["admissible"][t], history_turns=2,
                                    max_tokens=160).actions_dropped)
  assert [st.actions_dropped for st in steps] == dropped and sum(dropped) > 0


# ----------------------------------------------------------------------------------------
# The "think" action format: reasoning, then the action in <action>...</action>.


def test_think_format_episode_sends_parsed_actions_and_marks_malformed_answers_invalid():
  """On a real pool: the reasoning never reaches the environment; an answer without one
  wrapper is sent as the empty action and counted invalid even if the engine shrugs."""
  from csa_jax.rollout.sft_rows import demo_corpus  # pylint: disable=import-outside-toplevel
  from environments.demos import SEP, collect_demos  # pylint: disable=import-outside-toplevel

  env_kwargs = {"game": "twc"}
  records = collect_demos("twx", env_kwargs, "train", [0])
  for rec in records:
    rec["admissible"] = [a.split(SEP) for a in rec["admissible"]]
  think = P.PromptFormat(action_format="think")
  tok = train_bpe(demo_corpus(records, think), 600)
  cfg = RolloutConfig(max_turns=len(records[0]["actions"]) + 2, history_turns=2,
                      max_prompt_tokens=400, max_action_tokens=64, action_format="think")
  plan = list(records[0]["actions"])  # the expert's walk, replayed in order
  sent, prompts_seen = [], []
  with EnvPool("twx", env_kwargs, 1) as pool:

    def policy(prompts, rng):
      del rng
      prompts_seen.append(tok.decode(prompts[0]))
      turn = len(sent)
      # Turns 1 and 3 are malformed (no wrapper, two wrappers): they do not advance the
      # plan; the rest reason, then act.
      expert = plan[turn - (turn > 1) - (turn > 3)]
      text = {1: f" I will {expert}", 3: f" <action>{expert}</action><action>look</action>"
              }.get(turn, f" the goal says so. <action>{expert}</action>")
      sent.append(expert if turn not in (1, 3) else "")
      ids = tok.encode(text) + [tok.eos_id]
      return [ids], [[-0.5] * len(ids)]

    trajs = R.run_episodes(pool, policy, tok, [("train", 0)], cfg, np.random.default_rng(0),
                           fmt=think)
  steps = trajs[0].steps
  assert [st.action for st in steps] == sent[:len(steps)]
  assert [st.valid for st in steps][:4] == [True, False, True, False]
  assert all(st.valid for i, st in enumerate(steps) if i not in (1, 3))
  assert trajs[0].won  # the malformed turns cost steps, not the episode
  assert all(p.endswith(P.THINK_CUE) for p in prompts_seen)
  # The history the next prompt shows holds the parsed action, never the reasoning.
  assert "the goal says so" not in "".join(prompts_seen)


class _PromptPolicy:
  """A deterministic policy of the prompt alone: one of the listed actions (or an unknown
  one), picked by a hash of the prompt's text; with dispatch/collect like the sampler
  (collect answers), so rollout.overlap takes its asynchronous path. Records each call's
  width."""

  def __init__(self, tok):
    self.tok, self.widths = tok, []

  def dispatch(self, prompts, rng):
    del rng
    self.widths.append(len(prompts))
    return [list(p) for p in prompts]

  def collect(self, prompts):
    ids = []
    for p in prompts:
      text = self.tok.decode(p)
      listed = text.rsplit("Actions:", 1)[-1].split("\n")[0].split(" | ")
      choice = listed + ["dance"]
      a = choice[zlib.crc32(text.encode()) % len(choice)].strip() or "dance"
      ids.append(self.tok.encode(" " + a) + [self.tok.eos_id])
    return ids, [[-0.1 * len(x)] * len(x) for x in ids]

  def __call__(self, prompts, rng):
    return self.collect(self.dispatch(prompts, rng))


@pytest.mark.parametrize("num_envs", [3, 4])
def test_overlap_plays_the_serial_episodes(num_envs):
  """rollout.overlap: with a policy whose answer depends on the prompt alone, the two
  halves' episodes are step for step those of the serial loop (several waves, an odd
  number of slots, a last wave with idle slots); every overlapped call carries
  ceil(num_envs / 2) prompts, and the sampler padding counts match a count over the
  steps."""
  from csa_jax.perf import Timer

  tasks = [("train", i) for i in range(7)]
  cfg = dataclasses.replace(RolloutConfig(), max_turns=5, max_prompt_tokens=96)
  got = {}
  for overlap in (False, True):
    policy, timer = _PromptPolicy(TOK), Timer()
    with EnvPool("twx", {"game": "coin", "step_limit": 5}, num_envs) as pool:
      trajs = R.run_episodes(pool, policy, TOK, tasks, dataclasses.replace(cfg, overlap=overlap),
                             np.random.default_rng(0), perf=timer)
    got[overlap] = (trajs, policy.widths, timer)
  (serial, w_serial, t_serial), (over, w_over, t_over) = got[False], got[True]
  assert [tr.task for tr in over] == tasks
  key = lambda tr: (tr.won, tr.truncated, tr.error, [(s.prompt_ids, s.action_ids, s.action,
                                                       s.observation, s.reward, s.valid)
                                                      for s in tr.steps])
  assert [key(tr) for tr in over] == [key(tr) for tr in serial]
  assert sum(tr.length for tr in serial) > len(tasks)  # episodes of several steps
  half = -(-num_envs // 2)
  assert set(w_serial) == {num_envs} and set(w_over) == {half}
  steps = [s for tr in serial for s in tr.steps]
  for timer, widths in ((t_serial, w_serial), (t_over, w_over)):
    c = timer.counts
    assert c["prompt_tokens"] == sum(len(s.prompt_ids) for s in steps)
    assert c["prompt_slots"] == sum(widths) * cfg.max_prompt_tokens
    assert c["gen_tokens"] == sum(len(s.action_ids) for s in steps)
    assert timer.seconds["env"] > 0 and timer.seconds["sample"] > 0
    m = timer.metrics()
    assert m["perf/sampler_prompt_pad_frac"] == pytest.approx(
        1 - c["prompt_tokens"] / c["prompt_slots"])


class _BucketingPolicy(_PromptPolicy):
  """_PromptPolicy that says it samples the live rows alone, each padded to the next
  multiple of 16, as a sampler that skips dummies and buckets prompt widths
  (policy.SamplerPolicy.sampler_shape) would."""

  def sampler_shape(self, prompts):
    live = [p for p in prompts if p != R.dummy_prompt(TOK)]
    return len(live), -(-max(map(len, prompts)) // 16) * 16


def test_sampler_padding_counts_the_rows_and_width_the_policy_samples():
  from csa_jax.perf import Timer

  cfg = dataclasses.replace(RolloutConfig(), max_turns=3, max_prompt_tokens=512)
  policy, timer, slots = _BucketingPolicy(TOK), Timer(), []
  real = policy.dispatch
  policy.dispatch = lambda p, r: (slots.append(np.prod(policy.sampler_shape(p))), real(p, r))[1]
  with EnvPool("twx", {"game": "coin", "step_limit": 3}, 3) as pool:
    trajs = R.run_episodes(pool, policy, TOK, [("train", i) for i in range(3)], cfg,
                           np.random.default_rng(0), perf=timer)
  assert slots and timer.counts["prompt_slots"] == sum(slots)
  assert timer.counts["prompt_slots"] < len(slots) * 3 * cfg.max_prompt_tokens
  assert len(trajs) == 3



def test_sampler_policy_samples_only_live_rows_and_answers_as_the_full_batch():
  """policy.SamplerPolicy skips the dummies of finished slots: it samples the live rows in
  a quarter, a half or all of the call's rows, answers dummies with nothing, and (greedy,
  where no key enters) gives each live row what sampling every row gives it."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from csa_jax.config import ExperimentConfig
  from csa_jax.model import Decoder, ModelConfig
  from csa_jax.model import sampling
  from csa_jax.rollout.policy import SamplerPolicy, sampling_config

  cfg = ExperimentConfig(
      model=ModelConfig.tiny(vocab_size=TOK.vocab_size, max_seq_len=64),
      rollout=dataclasses.replace(RolloutConfig(), max_prompt_tokens=32, max_action_tokens=5,
                                  num_envs=8))
  graphdef, params = nnx.split(Decoder(cfg.model, rngs=nnx.Rngs(0)), nnx.Param)
  policy = SamplerPolicy(graphdef, lambda: params, TOK, cfg, greedy=True, key=jax.random.key(0))
  rng = np.random.default_rng(0)
  real = [list(rng.integers(3, TOK.vocab_size, rng.integers(4, 30))) for _ in range(8)]
  dummy = R.dummy_prompt(TOK)
  for live in ([0, 1, 2, 3, 4, 5, 6, 7], [2, 5, 6], [7], []):
    prompts = [real[i] if i in live else dummy for i in range(8)]
    rows, width = policy.sampler_shape(prompts)
    assert rows == next(r for r in (2, 4, 8) if r >= max(len(live), 1))
    assert width == sampling.bucket_length(max(map(len, prompts)), 32)
    ids, logps = policy(prompts, rng)
    tokens, mask = sampling.left_pad(prompts, TOK.pad_id, bucket=width)
    full = sampling.sample(nnx.merge(graphdef, params), jnp.asarray(tokens), jnp.asarray(mask),
                           rng=jax.random.key(1), pad_id=TOK.pad_id,
                           cfg=sampling_config(cfg, TOK, greedy=True))
    for i in range(8):
      n = int(full.lengths_B[i])
      if i in live:
        assert ids[i] == np.asarray(full.tokens_BxN)[i, :n].tolist()
        np.testing.assert_allclose(logps[i], np.asarray(full.logprobs_BxN)[i, :n], atol=1e-5)
      else:
        assert ids[i] == [] and logps[i] == []


def test_fit_groups_cut_mixed_lengths_into_fitted_batches():
  from csa_jax.rollout.policy import fit_groups

  lengths = [30, 250, 34, 261, 32, 240, 36, 255] * 2
  groups = fit_groups(lengths, budget=384, new_tokens=16, multiple=2)
  assert sorted(i for idx, _, _ in groups for i in idx) == list(range(16))
  assert len(groups) == 2
  for idx, rows, width in groups:
    assert rows >= len(idx) and rows % 2 == 0
    assert max(lengths[i] for i in idx) <= width <= 384
    assert width <= 1.125 * max(lengths[i] for i in idx)
  assert {max(lengths[i] for i in idx) for idx, _, _ in groups} == {36, 261}
  # Alike lengths stay one batch; the width never passes the budget; no prompts, no batch.
  assert len(fit_groups([70, 72, 74, 76] * 4, 80, 6)) == 1
  assert fit_groups([79], 80, 6) == [([0], 1, 80)]
  assert fit_groups([], 80, 6) == []


@pytest.mark.parametrize("share_prefix", [False, True])
def test_fitted_sampler_policy_answers_what_one_bucketed_batch_answers(share_prefix):
  """rollout.sampler_shapes=fit (and share_prefix): live prompts of two lengths sampled in
  fitted batches give each row the greedy answer and log-probs of the one bucketed batch."""
  import jax
  from flax import nnx

  from csa_jax.config import ExperimentConfig
  from csa_jax.model import Decoder, ModelConfig
  from csa_jax.rollout.policy import SamplerPolicy

  rollout = dataclasses.replace(RolloutConfig(), max_prompt_tokens=128, max_action_tokens=3,
                                num_envs=12)
  cfg = ExperimentConfig(model=ModelConfig.tiny(vocab_size=TOK.vocab_size, max_seq_len=160),
                         rollout=rollout)
  graphdef, params = nnx.split(Decoder(cfg.model, rngs=nnx.Rngs(0)), nnx.Param)
  fit_cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(
      rollout, sampler_shapes="fit", share_prefix=share_prefix))
  bucket = SamplerPolicy(graphdef, lambda: params, TOK, cfg, greedy=True, key=jax.random.key(0))
  fit = SamplerPolicy(graphdef, lambda: params, TOK, fit_cfg, greedy=True,
                      key=jax.random.key(0))
  rng = np.random.default_rng(1)
  head = list(rng.integers(3, TOK.vocab_size, 16))
  real = [head + list(rng.integers(3, TOK.vocab_size, n)) for n in (4, 105, 6, 100, 5, 103, 3)]
  dummy = R.dummy_prompt(TOK)
  prompts = real[:4] + [dummy] + real[4:] + [dummy] * 4
  groups = fit.sampler_groups(prompts)
  assert len(groups) == 2 and sorted(i for s, _, _ in groups for i in s) == [0, 1, 2, 3, 5, 6, 7]
  want_ids, want_logps = bucket(prompts, rng)
  got_ids, got_logps = fit(prompts, rng)
  assert got_ids == want_ids
  for a, b in zip(got_logps, want_logps):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  assert fit([dummy] * 12, rng) == ([[]] * 12, [[]] * 12)
