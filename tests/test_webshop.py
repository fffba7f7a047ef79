"""Tests of the WebShop re-creation: the reward against hand-computed cases, the pages, invalid
actions, the loader of WebShop's published file format on a tiny tree written here, the
generated catalogue's determinism, and the expert."""

import json
import subprocess
import sys

import pytest

from environments import demos, make_env
from environments.registry import env_version
from environments.webshop import catalog, reward
from environments.webshop import env as wenv
from environments.webshop.search import BM25Index

# ---- fuzzy matching and the reward --------------------------------------------------------


@pytest.mark.parametrize("a, b, expected", [
    ("red shoes", "Shoes, RED!", 100),  # processing: case and punctuation
    ("long lasting", "long lasting lipstick", 100),  # one token set inside the other
    ("abc", "abd", 67),  # no common token: Indel sim of "abc"/"abd" = 1 - 2/6
    # sect "lasting long" (12), rests "lipstick" (8) / "gloss" (5), LCS("lipstick","gloss")=2:
    # rests 1 - 9/39 = 76.9; sect vs sect+lipstick 1 - 9/33 = 72.7; sect vs sect+gloss
    # 1 - 6/30 = 80.0
    ("long lasting lipstick", "long lasting gloss", 80),
    ("", "anything", 0),
])
def test_token_set_ratio_hand_computed(a, b, expected):
  assert reward.token_set_ratio(a, b) == expected
  assert reward.token_set_ratio(b, a) == expected


def test_token_set_ratio_matches_rapidfuzz():
  """thefuzz.fuzz.token_set_ratio is int(round(rapidfuzz's, default_process)) for ASCII."""
  from rapidfuzz import fuzz, utils  # pylint: disable=g-import-not-at-top
  import random  # pylint: disable=g-import-not-at-top
  rng = random.Random(0)
  words = ["navy", "blue", "navy-blue", "x-large", "large", "8.5", "oz", "gluten", "free",
           "long", "lasting", "lipstick", "Gloss", "a", "b", "abc", "abd", "tea tree", "|"]
  for _ in range(2000):
    a = " ".join(rng.choice(words) for _ in range(rng.randint(0, 5)))
    b = " ".join(rng.choice(words) for _ in range(rng.randint(0, 5)))
    ref = int(round(fuzz.token_set_ratio(a, b, processor=utils.default_process)))
    assert reward.token_set_ratio(a, b) == ref, (a, b)


def _product(**kw):
  p = {"asin": "B000000001", "name": "Acme Trail Running Shoe", "Title": "Acme Trail Running Shoe",
       "Description": "A light shoe.", "BulletPoints": ["rubber sole"],
       "Attributes": ["non slip", "arch support"], "query": "running shoes",
       "product_category": "Clothing › Women › Shoes", "options": {}}
  p.update(kw)
  return p


def _goal(**kw):
  g = {"asin": "B000000001", "name": "Acme Trail Running Shoe", "query": "running shoes",
       "product_category": "Clothing › Women › Shoes",
       "attributes": ["non slip", "memory foam", "rubber sole"], "price_upper": 50.0,
       "goal_options": {"color": "navy blue", "size": "8"}}
  g.update(kw)
  return g


def test_reward_attributes_options_price():
  p = _product()
  # attrs: "non slip" (attribute), "rubber sole" (in the bullet points), not "memory foam";
  # options: color fuzzy match, size exact; price 40 <= 50.  (2 + 2 + 1) / (3 + 2 + 1)
  r, parts = reward.get_reward(p, _goal(), 40.0, {"color": "navy blue", "size": "8"})
  assert r == pytest.approx(5 / 6) and parts["r_type"] == 1.0
  # price above the limit, one option wrong: (2 + 1 + 0) / 6
  r, _ = reward.get_reward(p, _goal(), 50.01, {"color": "red", "size": "8"})
  assert r == pytest.approx(3 / 6)
  # "size" is matched exactly: "8.5" is not "8" though its token-set ratio is high
  assert reward.token_set_ratio("8", "8 5") == 100
  r, _ = reward.get_reward(p, _goal(), 40.0, {"color": "navy blue", "size": "8.5"})
  assert r == pytest.approx(4 / 6)
  # everything matched: 1
  full = _product(Attributes=["non slip", "memory foam"])
  assert reward.get_reward(full, _goal(), 10.0, {"color": "navy", "size": "8"})[0] == 1.0
  # a goal with no options: (attrs + price) / (n_attr + 1)
  r, _ = reward.get_reward(full, _goal(goal_options=[]), 10.0, {})
  assert r == 1.0


@pytest.mark.parametrize("name, query, cats, r_type", [
    ("Nova Road Running Shoe", "x", "A › B › C", 1.0),  # nouns 3/5 > 0.2
    ("Nova Shoe Box", "running shoes", "A › B › C", 1.0),  # 1/5 = 0.2, query matches
    ("Nova Shoe Box", "x", "Clothing › Women › Bags", 1.0),  # two breadcrumbs match
    ("Nova Shoe Box", "x", "A › B › C", 0.5),  # 0.2, nothing else matches
    ("Nova Sock", "running shoes", "Clothing › Women › Shoes", 0.0),  # no noun in common
])
def test_type_reward(name, query, cats, r_type):
  goal = _goal(name="Acme Trail Running Shoe Pair")  # 5 name tokens
  p = _product(name=name, query=query, product_category=cats)
  assert reward.type_reward(p, goal)["r_type"] == r_type
  r, _ = reward.get_reward(_product(name=name, query=query, product_category=cats,
                                    Attributes=["non slip", "memory foam"]),
                           goal, 10.0, {"color": "navy", "size": "8"})
  assert r == pytest.approx(r_type)


def test_type_reward_below_a_tenth():
  goal = _goal(name="a b c d e f g h i j k " + " ".join(f"w{c}" for c in "abcdefghijk"))
  nouns = reward.name_nouns(goal["name"])
  assert len(nouns) == 11  # single letters are dropped
  p = _product(name="wa other", query="running shoes")
  assert reward.type_reward(p, goal)["title_score"] == pytest.approx(1 / 11)
  assert reward.type_reward(p, goal)["r_type"] == 0.1


def test_bm25_hand_computed():
  idx = BM25Index(["red shoe", "blue shoe shoe", "red hat"])
  n, avgdl = 3, 7 / 3
  import math
  idf_red = math.log(1 + (n - 2 + 0.5) / 2.5)
  idf_shoe = idf_red
  w = lambda tf, dl: tf / (tf + 0.9 * (1 - 0.4 + 0.4 * dl / avgdl))
  s = idx.scores("red shoe")
  assert s[0] == pytest.approx(idf_red * w(1, 2) + idf_shoe * w(1, 2))
  assert s[1] == pytest.approx(idf_shoe * w(2, 3))
  assert s[2] == pytest.approx(idf_red * w(1, 2))
  assert idx.search("red shoe") == [0, 1, 2] and idx.search("the") == []


# ---- a tiny tree in WebShop's published format ---------------------------------------------

def _raw_products():
  prods = []
  for i in range(14):
    prods.append({
        "asin": f"B00000{i:04d}", "name": f"Brand{i} Cotton T-Shirt number{i}",
        "full_description": f"A cotton t-shirt number{i}.",
        "small_description": [f"machine wash shirt {i}", "cotton"] if i % 2 else "cotton tee",
        "pricing": "$10.00 - $20.00" if i == 0 else f"${5 + i}.99",
        "customization_options": ({"Color": [{"value": "Navy/White", "image": None},
                                             {"value": "Black", "image": None}],
                                   "Size": [{"value": "Small", "image": None},
                                            {"value": "Large", "image": None}]}
                                  if i != 3 else None),
        "images": ["x"], "query": " T Shirts ", "category": "fashion",
        "product_category": "Clothing › Men › Shirts",
    })
  prods.append(dict(prods[1]))  # a duplicate asin: skipped
  prods.append(dict(prods[2], asin="nan"))  # skipped
  return prods


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
  d = tmp_path_factory.mktemp("webshop_data")
  prods = _raw_products()
  ins = {p["asin"]: {"attributes": ["machine wash", "cotton"],
                     "instruction": "i need a machine wash cotton t-shirt",
                     "instruction_attributes": ["machine wash"]}
         for p in prods[:12] if p["asin"] != "B000000005"}
  human = {p["asin"]: [{"instruction": f"i want a cotton t-shirt number{k}.",
                        "instruction_attributes": ["cotton"],
                        "instruction_options": ["navy | white", "small"]},
                       {"instruction": "no attributes", "instruction_attributes": [],
                        "instruction_options": []}]
           for k, p in enumerate(prods[:12])}
  reviews = [{"asin": "B000000001", "average_rating": 4.5,
              "reviews": [{"title": "Nice", "stars": 5, "review": "fits well"}]}]
  for name, obj in (("items_shuffle_1000.json", prods), ("items_ins_v2_1000.json", ins),
                    ("items_human_ins.json", human), ("reviews.json", reviews)):
    (d / name).write_text(json.dumps(obj))
  return str(d)


def test_loader_reads_the_published_format(tree):
  raw = catalog.read_raw(tree)
  prods = catalog.load_products(raw, human_goals=True)
  assert [p["asin"] for p in prods] == [f"B00000{i:04d}" for i in range(14)]
  p0, p1, p3, p5 = prods[0], prods[1], prods[3], prods[5]
  assert p0["pricing"] == [10.0, 20.0] and p0["Price"] == "$10.0 to $20.0"
  assert p1["pricing"] == [6.99] and p1["Price"] == "$6.99"
  assert p0["options"] == {"color": ["navy | white", "black"], "size": ["small", "large"]}
  assert p3["options"] == {}
  assert p0["BulletPoints"] == ["cotton tee"] and p1["BulletPoints"][1] == "cotton"
  assert p1["Reviews"] == [{"title": "Nice", "score": 5, "body": "fits well"}]
  assert p1["Rating"] == 4.5 and p0["Rating"] == "N.A."
  assert p5["Attributes"] == ["DUMMY_ATTR"] and p1["Attributes"] == ["machine wash", "cotton"]
  assert p0["query"] == "t shirts"
  prices = {p["asin"]: catalog.product_price(p, 0) for p in prods}
  assert 10.0 <= prices["B000000000"] <= 20.0 and prices["B000000001"] == 6.99
  goals = catalog.human_goals(prods, prices, 0)
  assert len(goals) == 12  # the instruction without attributes is skipped
  g = goals[1]
  # price 6.99 -> limits drawn among 10, 20, 30, 40; the larger of two
  assert g["price_upper"] in (20.0, 30.0, 40.0)
  assert g["instruction_text"] == (f"i want a cotton t-shirt number1, and price lower than "
                                   f"{g['price_upper']:.2f} dollars")
  assert g["goal_options"] == ["navy | white", "small"]
  syn = catalog.synthetic_goals(catalog.load_products(raw, human_goals=False), prices, 0)
  # 11 instructed products; product 3 has no options (1 goal), the others 2 x 2 combinations
  assert len(syn) == 10 * 4 + 1
  assert syn[0]["instruction_text"].startswith(
      "i need a machine wash cotton t-shirt with color: navy | white, and size: small, and price")
  assert catalog.split_goals(goals, (3, 5))["eval"] == catalog.split_goals(goals, (3, 5))["eval"]


def test_real_source_env_on_the_tiny_tree(tree, monkeypatch):
  monkeypatch.setenv("WEBSHOP_DATA", tree)
  env = make_env("webshop", source="real", split_bounds=(3, 6))
  assert (env.num_tasks("test"), env.num_tasks("eval"), env.num_tasks("train")) == (3, 3, 6)
  wins = 0
  for split in env.splits:
    for i in range(env.num_tasks(split)):
      r = env.reset(split, i)
      assert r.info.extra["source"] == "real"
      while not r.done:
        r = env.step(env.expert_action())
        assert r.info.action_valid and r.info.extra["source"] == "real"
      wins += r.info.won
  # every human goal but product 3's asks for options its target offers (product 3 has none,
  # so its goal can score at most (1 + 0 + 1) / 4)
  assert wins == 11
  with pytest.raises(catalog.DataError):
    make_env("webshop", source="real", data_dir=tree + "/missing")


# ---- pages and actions -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(tree):
  return make_env("webshop", source="real", data_dir=tree, split_bounds=(3, 6))


def test_page_transitions(env):
  r = env.reset("test", 0)
  instr = r.info.task
  assert r.observation == f"WebShop [SEP] Instruction: [SEP] {instr} [SEP] Search"
  assert r.info.admissible_actions == ("search[<your query>]",)
  r = env.step("search[cotton t-shirt]")
  head = f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] "
  assert r.observation.startswith(head + "Page 1 (Total results: 14) [SEP] Next > [SEP] B0")
  assert r.observation.count(" [SEP] B0") == 10
  assert r.info.admissible_actions[:2] == ("click[back to search]", "click[next >]")
  assert len(r.info.admissible_actions) == 12
  r = env.step("click[Next >]")  # matched lower-case
  assert "Page 2 (Total results: 14) [SEP] < Prev [SEP] B0" in r.observation
  assert r.observation.count(" [SEP] B0") == 4
  r = env.step("click[< prev]")
  assert "Page 1 (Total results: 14)" in r.observation
  asin = r.observation.split(" [SEP] ")[5]
  p = env._product(asin)
  r = env.step(f"click[{asin.lower()}]")
  opts = " [SEP] ".join(f"{k} [SEP] {' [SEP] '.join(v)}" for k, v in p["options"].items())
  assert r.observation == (head + "< Prev [SEP] " + (opts + " [SEP] " if opts else "")
                           + f"{p['Title']} [SEP] Price: {p['Price']} [SEP] Rating: "
                           f"{p['Rating']} [SEP] Description [SEP] Features [SEP] Reviews "
                           "[SEP] Buy Now")
  item_anchor = r.info.anchor
  r = env.step("click[features]")
  assert r.observation == head + "< Prev [SEP] " + " [SEP] ".join(p["BulletPoints"])
  r = env.step("click[< prev]")
  assert r.info.anchor == item_anchor
  r = env.step("click[< prev]")
  assert "Page 1 (Total results: 14)" in r.observation
  r = env.step("click[back to search]")
  assert r.observation.startswith("WebShop [SEP] Instruction:") and r.info.anchor.startswith(
      "search|")
  assert not r.done


def test_buy_now_reward_and_options(env):
  r = env.reset("train", 0)
  g = env.goal("train", 0)
  r = env.step(f"search[{g['name']}]")
  target = g["asin"].lower()
  while f"click[{target}]" not in r.info.admissible_actions:
    r = env.step("click[next >]")
  env.step(f"click[{target}]")
  env.step("click[navy | white]")
  r = env.step("click[large]")  # the goal wants small
  assert r.info.anchor.endswith('{"color": "navy | white", "size": "large"}|')
  r = env.step("click[buy now]")
  p = env._product(g["asin"])
  expected, _ = reward.get_reward(p, g, env.world.prices[g["asin"]],
                                  {"color": "navy | white", "size": "large"})
  # cotton matches, navy matches, size does not, the price is below the limit: 3 / 4
  assert expected == pytest.approx(3 / 4)
  assert r.done and r.reward == pytest.approx(expected) and not r.info.won
  assert r.info.oracle_label == -1.0 and r.info.admissible_actions == ()
  assert r.observation.startswith("Thank you for shopping with us! [SEP] Purchased [SEP] "
                                  + g["asin"])
  assert r.info.extra["n_opt"] == 1 and r.info.extra["r_price"]


@pytest.mark.parametrize("action, why", [
    ("click[nothing here]", "there is no 'nothing here' to click on this page."),
    ("search cotton", "write search[keywords] or click[element]."),
    ("search[]", "write search[keywords] or click[element]."),
    ("click[buy now", "write search[keywords] or click[element]."),
    ("search[   ]", "the search keywords are empty."),
    ("jump[high]", "unknown action 'jump'; write search[keywords] or click[element]."),
    ("click[search]", "there is no 'search' to click on this page."),
    ("x" * 5000, "the action is longer than 2000 characters."),
])
def test_invalid_actions_are_answered_readably(env, action, why):
  r0 = env.reset("test", 1)
  r = env.step(action)
  assert not r.info.action_valid and r.reward == 0.0 and not r.done
  assert r.observation == f"Invalid action: {why}\n{r0.observation}"
  assert r.info.anchor == r0.info.anchor and r.info.oracle_label == 0.0


def test_step_limit_truncates(env):
  r = env.reset("test", 0)
  for k in range(15):
    assert not r.done
    r = env.step("click[nowhere]")
  assert r.done and r.info.truncated and not r.info.won and r.reward == 0.0


# ---- the generated catalogue and the expert -------------------------------------------------

def test_generated_catalogue_is_deterministic():
  a, b = catalog.generate_raw(0, 2, 3), catalog.generate_raw(0, 2, 3)
  assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
  assert json.dumps(catalog.generate_raw(1, 2, 3)) != json.dumps(a)
  assert len(a["products"]) == 30 * 2 * 3
  w1 = wenv.build_world(a, "synthetic", 0, None, (10, 20))
  w2 = wenv.build_world(b, "synthetic", 0, None, (10, 20))
  assert w1.goals == w2.goals and w1.prices == w2.prices
  # near duplicates: every family of 3 shares the product type and core attributes
  titles = [p["name"] for p in a["products"]]
  assert len(set(titles)) < len(titles) or len({t.split()[-1] for t in titles}) < 40


def test_expert_wins_generated_goals_with_oracle_labels():
  env = make_env("webshop")  # the default catalogue: 3,000 products
  assert len(env.world.products) == 3000
  assert (env.num_tasks("test"), env.num_tasks("eval")) == (500, 1000)
  assert env.num_tasks("train") > 1500
  for split in env.splits:
    for i in range(0, env.num_tasks(split), 97):
      r = env.reset(split, i)
      d0 = env.expert_distance()
      labels = []
      while not r.done:
        r = env.step(env.expert_action())
        labels.append(r.info.oracle_label)
        assert r.info.extra["source"] == "generated"
      assert r.info.won and r.reward == 1.0
      assert labels == [1.0] * len(labels) and len(labels) == d0 <= 15


def test_random_detour_labels_sum_to_the_distance_change():
  env = make_env("webshop")
  r = env.reset("test", 7)
  d0 = env.expert_distance()
  total = 0.0
  for a in ("search[cotton towel]", "click[back to search]", env.expert_action()):
    r = env.step(a)
    total += r.info.oracle_label
  assert total == pytest.approx(d0 - env.expert_distance())


def test_demonstrations_of_the_expert():
  recs = demos.collect_demos("webshop", {}, "train", [0, 1, 2])
  assert all(r["won"] and r["rewards"][-1] == 1.0 and sum(r["rewards"]) == 1.0 for r in recs)
  assert recs[0]["actions"][0].startswith("search[") and recs[0]["actions"][-1] == "click[buy now]"
  assert env_version("webshop") == "webshop r1"


def test_demo_cli_prints_three_won_expert_episodes():
  out = subprocess.run([sys.executable, "-m", "environments.demo", "webshop", "--expert", "3",
                        "--random", "0"], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  ends = [l for l in out.stdout.splitlines() if l.startswith("--- won=")]
  assert len(ends) == 3 and all(l.startswith("--- won=True") for l in ends)


def test_every_method_has_a_webshop_experiment():
  import experiments  # pylint: disable=g-import-not-at-top
  from experiments.variants import VARIANTS  # pylint: disable=g-import-not-at-top
  for algo in VARIANTS:
    cfg = experiments.get_experiment(f"webshop_{algo}")
    assert cfg.env.name == "webshop" and cfg.env.kwargs["step_limit"] == 15
    assert (cfg.env.train_split, cfg.env.eval_split) == ("train", "test")
    assert cfg.rollout.max_turns == 15


@pytest.mark.slow
def test_launch_webshop_csa_sft_then_rl(tmp_path):
  sets = ["sft.num_demos=6", "sft.epochs=2", "sft.batch_size=16", "rollout.tasks_per_iter=2",
          "rollout.group_size=2", "rollout.num_envs=4", "rollout.max_turns=4",
          "rollout.max_prompt_tokens=160", "rollout.max_action_tokens=24",
          "algo.minibatch_size=8", "eval.num_episodes=2", "tokenizer.vocab_size=512",
          "model.vocab_size=512", "model.max_seq_len=192", "env.kwargs.step_limit=4",
          "rl_iterations=1", "checkpoint_every=1", f"sft.demos_dir={tmp_path / 'demos'}"]
  argv = [sys.executable, "launch.py", "--exp", "webshop_csa", "--workdir", str(tmp_path / "w")]
  for s in sets:
    argv += ["--set", s]
  out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = [json.loads(l) for l in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
  assert any("sft/nll" in l for l in lines)
  rl = [l for l in lines if "rollout/env_steps" in l]
  assert len(rl) == 1 and rl[0]["rollout/env_steps"] > 0 and rl[0]["rollout/errors"] == 0
  # every step carries the oracle label the credit metrics read
  assert rl[0]["credit/labelled_steps"] == rl[0]["rollout/env_steps"]
