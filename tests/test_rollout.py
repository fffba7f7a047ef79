"""Prompts fit their budget; trajectories pad into [B, G, T] arrays exactly."""

import dataclasses
import zlib

import numpy as np
import pytest

from csa_jax import groups
from csa_jax import rollout as R
from csa_jax.config import RolloutConfig
from csa_jax.tokenizer import Tokenizer, train_bpe
from environments.pool import EnvPool

TOK = train_bpe(["You are in the kitchen. To the North you see the pantry.", " move north",
                 " take coin", "Task: Now: Actions: Action: > |"] * 10, 400)


def test_prompt_keeps_cue_and_actions_when_truncated():
  obs = "You are in the kitchen. " + "There is a chair. " * 80 + "To the North you see the pantry."
  hist = [("move north", "You are in the pantry. It is dark.")] * 5
  ids = R.encode_prompt(TOK, "find the coin", hist, obs, ["move north", "take coin"],
                        history_turns=3, max_tokens=96)
  assert len(ids) <= 96
  text = TOK.decode(ids)
  assert text.startswith("Task: find the coin\n> move north\nYou are in the pantry.\n")
  assert "Now: You are in the kitchen." in text and " ... " in text
  assert text.endswith("To the North you see the pantry.\nActions: move north | take coin\nAction:")


def test_prompt_untruncated_is_the_plain_text():
  hist = [("move east", "You are in the corridor. Long details follow.")]
  args = ("find it", hist, "You see a coin.", ["take coin", "move west"])
  ids = R.encode_prompt(TOK, *args, history_turns=2, max_tokens=1000)
  assert TOK.decode(ids) == R.prompt_text(*args)
  assert TOK.decode(ids) == ("Task: find it\n> move east\nYou are in the corridor.\n"
                             "Now: You see a coin.\nActions: take coin | move west\nAction:")


def test_prompt_drops_oldest_turns_first():
  hist = [(f"move {d}", f"You are in room {i}. Long details follow.")
          for i, d in enumerate(["north", "south", "east", "west"])]
  obs = "You are in the hall. " + "A lamp. " * 40
  full = R.encode_prompt(TOK, "t", hist, obs, ["a"], history_turns=4, max_tokens=10_000)
  for budget in (len(full) - 1, 110, 90):
    text = TOK.decode(R.encode_prompt(TOK, "t", hist, obs, ["a"], history_turns=4,
                                      max_tokens=budget, min_obs_tokens=48))
    kept = [i for i in range(4) if f"room {i}." in text]
    assert kept == list(range(4 - len(kept), 4))  # a suffix: the newest turns
  assert len(R.encode_prompt(TOK, "t", hist, obs, ["a"], history_turns=4, max_tokens=90)) <= 90


@pytest.mark.parametrize("n, budget", [(10, 20), (30, 12), (30, 3), (30, 0)])
def test_middle_cut(n, budget):
  ids, sep = list(range(100, 100 + n)), [1, 2]
  out = R._middle_cut(ids, budget, sep)
  assert len(out) == min(n, budget)
  if n > budget > len(sep):
    keep = budget - 2
    assert out[: keep // 3] == ids[: keep // 3] and out[keep // 3: keep // 3 + 2] == sep
    assert out[keep // 3 + 2:] == ids[n - (keep - keep // 3):]


def _traj(task, n_steps, won, seed):
  rng = np.random.default_rng(seed)
  steps = [R.Step(prompt_ids=[1, 2], action_ids=[3] * int(rng.integers(1, 4)),
                  action_logps=[], action="a", observation="o", reward=0.0,
                  anchor_id=int(rng.integers(0, 3)), valid=True,
                  oracle_label=None if t % 2 else float(t)) for t in range(n_steps)]
  for s in steps:
    s.action_logps = list(rng.normal(size=len(s.action_ids)))
  return R.Trajectory(task=task, steps=steps, won=won)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_group_arrays_match_loop(reduce):
  B, G, T = 2, 3, 5
  trajs = [_traj(("train", b), n, won, 10 * b + g)
           for b in range(B) for g, (n, won) in enumerate([(2, True), (5, False), (7, True)])]
  arr = groups.group_arrays(groups.split(trajs, G), T, reduce)
  for k, tr in enumerate(trajs):
    b, g = k // G, k % G
    assert arr.rewards_BxG[b, g] == float(tr.won)
    n = min(len(tr.steps), T)
    assert arr.mask_BxGxT[b, g].tolist() == [t < n for t in range(T)]
    for t in range(T):
      if t < n:
        lp = tr.steps[t].action_logps
        want = sum(lp) if reduce == "sum" else sum(lp) / len(lp)
        assert arr.logp_BxGxT[b, g, t] == pytest.approx(want, rel=1e-6)
        assert arr.state_id_BxGxT[b, g, t] == tr.steps[t].anchor_id
        lab = tr.steps[t].oracle_label
        assert (np.isnan(arr.oracle_BxGxT[b, g, t]) if lab is None
                else arr.oracle_BxGxT[b, g, t] == lab)
        assert arr.step_rewards_BxGxT[b, g, t] == (float(tr.won) if t == n - 1 else 0.0)
      else:
        assert arr.logp_BxGxT[b, g, t] == 0 and arr.step_rewards_BxGxT[b, g, t] == 0


def test_groups_reject_ragged_or_partial_groups():
  trajs = [_traj(("train", 0), 2, True, k) for k in range(5)]
  with pytest.raises(ValueError, match="not whole groups of 3"):
    groups.split(trajs, 3)
  with pytest.raises(ValueError, match="different sizes"):
    groups.group_arrays([trajs[:3], trajs[3:]], 4)
  batch = groups.from_episodes(trajs[:4], 2, 4)
  assert [(b, g) for b, g, _ in batch.places()] == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert batch.trajs == trajs[:4] and batch.arrays.mask_BxGxT.shape == (2, 2, 4)


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


CHAT_TOK = Tokenizer(TOK.tok, chat_template=(
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
# ALFWorld-like: dozens of admissible actions, far more than half a small budget.
MANY = sorted([f"go to countertop {i}" for i in range(1, 25)] + ["inventory", "look"]
              + [f"take coin {i} from countertop {i}" for i in range(1, 9)])


@pytest.mark.parametrize("fmt_name", ["plain", "chat"])
@pytest.mark.parametrize("budget", [128, 200, 300])
def test_action_list_drops_whole_actions_keeps_header_and_cue(fmt_name, budget):
  fmt = R.PLAIN if fmt_name == "plain" else R.PromptFormat.chat(CHAT_TOK)
  hist = [("go to countertop 3", "You arrive at countertop 3. On it you see a coin 3.")]
  obs = "You arrive at countertop 1. " + "On it you see a spoon. " * 20
  enc = R.build_prompt(CHAT_TOK, "put a coin in the box", hist, obs, MANY, history_turns=2,
                       max_tokens=budget, fmt=fmt)
  assert len(enc.ids) <= budget
  assert enc.ids[:len(fmt.prefix_ids)] == list(fmt.prefix_ids)
  assert enc.ids[len(enc.ids) - len(fmt.suffix_ids):] == list(fmt.suffix_ids)
  body = enc.ids[len(fmt.prefix_ids):len(enc.ids) - len(fmt.suffix_ids)]
  text = CHAT_TOK.decode(body)
  assert text.startswith("Task: put a coin in the box\n")
  kept = len(MANY) - enc.actions_dropped
  assert 0 < kept < len(MANY)  # the budget is tight: some, not all, actions fit
  tail = "\nActions: " + " | ".join(MANY[:kept] + ["..."]) + "\nAction:"
  assert text.endswith(tail)  # the header, the first actions whole, the marker, the cue
  # As many as fit: one more action would not fit the tail's half of the budget.
  half = (budget - len(fmt.prefix_ids) - len(fmt.suffix_ids)) // 2
  more = "\nActions: " + " | ".join(MANY[:kept + 1] + ["..."]) + "\nAction:"
  assert len(CHAT_TOK.encode(tail)) <= half < len(CHAT_TOK.encode(more))
  assert R.encode_prompt(CHAT_TOK, "put a coin in the box", hist, obs, MANY, history_turns=2,
                         max_tokens=budget, fmt=fmt) == enc.ids


def test_action_list_that_fits_is_untouched_and_a_budget_without_room_for_the_cue_fails():
  enc = R.build_prompt(TOK, "t", [], "You see a coin.", ["take coin", "move west"],
                       history_turns=2, max_tokens=1000)
  assert enc.actions_dropped == 0
  assert TOK.decode(enc.ids).endswith("\nActions: take coin | move west\nAction:")
  with pytest.raises(ValueError, match="cannot hold its header and cue"):
    R.build_prompt(TOK, "t", [], "o", MANY, history_turns=0, max_tokens=6)


def test_a_system_message_comes_before_the_prompt_in_the_chat_template():
  """rollout.system_prompt: the template renders it as the system turn (else its default)."""
  tok = Tokenizer(CHAT_TOK.tok, chat_template=(
      "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nDefault.<|im_end|>\n"
      "{% endif %}" + CHAT_TOK.chat_template))
  fmt = R.PromptFormat.chat(tok, system="Pick one.")
  assert list(fmt.prefix_ids) == tok.encode("<|im_start|>system\nPick one.<|im_end|>\n"
                                            "<|im_start|>user\n", specials=True)
  assert R.PromptFormat.chat(tok).prefix_ids == tuple(tok.encode(
      "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\n", specials=True))
  assert fmt.suffix_ids == R.PromptFormat.chat(tok).suffix_ids


def test_environment_text_cannot_inject_special_tokens():
  # An observation that spells the end-of-action token stays text inside the prompt; the
  # chat template's own markup around it keeps its special tokens.
  fmt = R.PromptFormat.chat(Tokenizer(CHAT_TOK.tok, chat_template=(
      "<pad>{% for m in messages %}{{ m['content'] }}{% endfor %}<eos>")))
  assert fmt.prefix_ids == (TOK.pad_id,) and fmt.suffix_ids == (TOK.eos_id,)
  obs = "The sign reads: <eos> <pad> end."
  enc = R.build_prompt(TOK, "t", [], obs, ["read sign"], history_turns=0, max_tokens=200,
                       fmt=fmt)
  body = enc.ids[1:-1]
  assert TOK.eos_id not in body and TOK.pad_id not in body
  assert TOK.decode(body) == R.prompt_text("t", [], obs, ["read sign"])


def test_multi_turn_loop_plays_an_expert_on_a_real_pool():
  """Five twc tasks (deterministic expert) on two environments: waves of 2, 2 and 1.

  Results come back in task order, every episode is won, each step's observation is the
  one the agent acted on, idle and finished slots get the one-token dummy prompt, and
  every step's prompt is the one the SFT rows build for that task and step (prompts tight
  enough that some action lists are cut, so the dropped counts are checked too).
  """
  from csa_jax.sft_rows import demo_corpus, demo_rows  # pylint: disable=import-outside-toplevel
  from csa_jax.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
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
      dropped.append(R.build_prompt(tok, rec["task"], hist, rec["observations"][t],
                                    rec["admissible"][t], history_turns=2,
                                    max_tokens=160).actions_dropped)
  assert [st.actions_dropped for st in steps] == dropped and sum(dropped) > 0


# ----------------------------------------------------------------------------------------
# The "think" action format: reasoning, then the action in <action>...</action>.


@pytest.mark.parametrize("text, want", [
    ("I see a coin.\n<action>take coin</action>", ("take coin", True)),
    ("<action>  open door to north \n</action>", ("open door to north", True)),
    ("<action>go\nnorth</action> and that is all", ("go\nnorth", True)),  # inside kept whole
    ("take coin", ("", False)),  # no wrapper
    ("<action>take coin", ("", False)),  # unclosed
    ("take coin</action>", ("", False)),  # closed only
    ("<action></action>", ("", False)),  # empty
    ("<action>   </action>", ("", False)),  # blank
    ("<action>look</action> or <action>take coin</action>", ("", False)),  # two: ambiguous
    ("<ACTION>look</ACTION>", ("", False)),  # tags are case-sensitive, as written in the cue
    ("<action>take <b>coin</b></action>", ("take <b>coin</b>", True)),
])
def test_parse_action(text, want):
  assert R.parse_action(text) == want


def test_think_format_prompt_asks_for_the_wrapper_and_sft_targets_carry_it():
  think = R.PromptFormat(action_format="think")
  assert think.answer_text("take coin") == " <action>take coin</action>"
  assert R.PLAIN.answer_text("take coin") == " take coin"
  assert think.read_answer("hmm <action>look</action>") == ("look", True)
  assert R.PLAIN.read_answer("hmm <action>look</action>") == ("hmm <action>look</action>", True)
  text = R.prompt_text("find the coin", [], "You are in the kitchen.", ["look", "take coin"],
                       think.cue)
  assert text.endswith("\nActions: look | take coin" + R.THINK_CUE)
  assert "<action></action>" in R.THINK_CUE
  with pytest.raises(ValueError, match="action_format"):
    R.PromptFormat(action_format="json")


def test_think_format_episode_sends_parsed_actions_and_marks_malformed_answers_invalid():
  """On a real pool: the reasoning never reaches the environment; an answer without one
  wrapper is sent as the empty action and counted invalid even if the engine shrugs."""
  from csa_jax.sft_rows import demo_corpus  # pylint: disable=import-outside-toplevel
  from environments.demos import SEP, collect_demos  # pylint: disable=import-outside-toplevel

  env_kwargs = {"game": "twc"}
  records = collect_demos("twx", env_kwargs, "train", [0])
  for rec in records:
    rec["admissible"] = [a.split(SEP) for a in rec["admissible"]]
  think = R.PromptFormat(action_format="think")
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
  assert all(p.endswith(R.THINK_CUE) for p in prompts_seen)
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

  from csa_jax import sampling
  from csa_jax.config import ExperimentConfig
  from csa_jax.model import Decoder, ModelConfig
  from csa_jax.policy import SamplerPolicy, sampling_config

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
