"""WebShop (Yao et al., 2022) in text mode, behind the TextEnv protocol, in pure Python.

Re-created from the published behaviour of `web_agent_site/envs/web_agent_text_env.py`
(observation_mode="text", the one verl-agent, GiGPO and iStar train on):

Pages and actions (faithful). `search[keywords]` runs the search (from any page, as upstream;
listed as admissible only on the search page, where the search bar is); `click[element]`
clicks an element of the current page, matched lower-case. The search page shows the
instruction and the search bar; a results page shows "Back to Search", "Page p (Total
results: n)", "< Prev" / "Next >" where there are such pages, then per product its ASIN (the
link), title and price, 10 per page of the top 50 hits; an item page shows "Back to Search",
"< Prev" (to the results page), each option name with its values, the title, "Price: ...",
"Rating: ...", "Description", "Features", "Reviews" (sub-pages with "< Prev" back to the item)
and "Buy Now". Clicking an option value selects it (a value offered by two options selects
the later, as upstream's dict of clickables does); selections persist until the next search,
even across products, as upstream; "Back to Search" starts the session over. The
observation is the page's visible texts joined by " [SEP] " with the instruction on top.
"Buy Now" ends the episode with the reward of `reward.get_reward`; success is reward 1. The
episode is truncated after `step_limit` steps (15, as in verl-agent's WebShop runs).

Differs: an action upstream does not understand (no brackets, an element not on the page,
an empty search) changes nothing and returns the same page; here it also changes nothing,
and the observation says why on a first line ("Invalid action: ...") before the page, with
`action_valid=False`. The done page reads "Thank you for shopping with us! [SEP] Purchased
[SEP] ASIN [SEP] options [SEP] Your score (min 0.0, max 1.0) [SEP] r" (upstream adds an MTurk
code). Search, prices and r_type: see search.py, catalog.py and reward.py.

Sources: `source="generated"` (default) builds `catalog.generate_raw(seed)` (3,000 products,
synthetic goals); `source="real"` reads WebShop's JSON files from `data_dir` or the
WEBSHOP_DATA environment variable (`goals="human"`, the 12k human instructions, by default).
Splits: "test" = goals 0-499, "eval" = 500-1499, "train" = 1500+ of the goal list shuffled
with seed 233 (`split_bounds` moves the cuts, e.g. for a small data set).

StepInfo:
  * task: the instruction text. anchor: the page and what selects it (page kind, search
    keywords, results page, product, chosen options, sub-page), without history.
  * won: reward 1 at Buy Now. extra: source, split, index, asin (the goal's product), page,
    and at Buy Now the reward's parts (r_type, n_attr, n_opt, r_price).
  * oracle_label: the decrease of `expert_distance` (steps to a win along the expert's plan:
    search the expert query, page to the target, open it, choose the goal options, buy); a
    Buy Now that does not win is -1 (the episode can no longer be won); an invalid action is 0.
    The distance is that of the expert's plan from the current page, an upper bound on the
    shortest way to a win (a near duplicate that also scores 1, or a query that ranks the
    target higher, can be nearer), and it ignores the steps left; so the label measures
    progress along that plan, not against the exact optimum.
Expert: follows the plan above; its query is the instruction's key terms (`expert_query`:
no opening phrase, option names or price clause), or the target's title where the
instruction does not bring the target into the top 50.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from typing import Any

from environments.base import StepInfo, StepResult, TextEnv
from environments.registry import register_env
from environments.webshop import catalog, reward
from environments.webshop.search import SEARCH_RETURN_N, BM25Index

PRODUCT_WINDOW = 10
SEP = " [SEP] "
BACK, NEXT, PREV, BUY = "back to search", "next >", "< prev", "buy now"
SUB_PAGES = ("description", "features", "reviews")
_ACTION = re.compile(r"(.+)\[(.+)\]", re.DOTALL)  # upstream's parse_action
_PRICE_CLAUSE = re.compile(r", and price lower than [\d.]+ dollars$")
_OPENING = re.compile(r"^(i am looking for|i'm looking for|i need|i want|find me|get me)( an?)? ")
_OPTION_NAME = re.compile(r"(?: with|, and) [a-z]+(?: [a-z]+)?: ")


def expert_query(instruction: str) -> str:
  """The instruction's key terms: no opening phrase, option names or price clause."""
  text = _PRICE_CLAUSE.sub("", instruction.lower()).strip()
  return " ".join(_OPTION_NAME.sub(" ", _OPENING.sub("", text)).split())


@dataclasses.dataclass(frozen=True)
class World:
  """Products, their search index and the goals by split (shared by envs of one config)."""

  products: tuple[dict[str, Any], ...]
  by_asin: dict[str, int]
  prices: dict[str, float]
  index: BM25Index
  goals: dict[str, list[dict[str, Any]]]


def _doc_text(p: dict[str, Any]) -> str:
  """What WebShop's index holds per product (convert_product_file_format.py), lower-cased."""
  options = ", and ".join(f"{name}: {', and '.join(values)}"
                          for name, values in p["options"].items())
  return " ".join([p["Title"], p["Description"], p["BulletPoints"][0] if p["BulletPoints"] else "",
                   options]).lower()


def build_world(raw: dict[str, Any], goals: str, seed: int, num_products: int | None,
                split_bounds: tuple[int, int]) -> World:
  human = goals == "human"
  products = catalog.load_products(raw, num_products, human_goals=human)
  prices = {p["asin"]: catalog.product_price(p, seed) for p in products}
  make = catalog.human_goals if human else catalog.synthetic_goals
  return World(products=tuple(products), by_asin={p["asin"]: i for i, p in enumerate(products)},
               prices=prices, index=BM25Index([_doc_text(p) for p in products]),
               goals=catalog.split_goals(make(products, prices, seed), tuple(split_bounds)))


_WORLDS: dict[tuple, World] = {}
_WORLDS_LOCK = threading.Lock()


def get_world(source: str, data_dir: str | None, goals: str, seed: int,
              num_products: int | None, split_bounds: tuple[int, int],
              families_per_type: int, family_size: int) -> World:
  key = (source, data_dir, goals, seed, num_products, tuple(split_bounds), families_per_type,
         family_size)
  with _WORLDS_LOCK:
    if key not in _WORLDS:
      raw = (catalog.generate_raw(seed, families_per_type, family_size) if source == "generated"
             else catalog.read_raw(data_dir))
      _WORLDS[key] = build_world(raw, goals, seed, num_products, split_bounds)
    return _WORLDS[key]


@dataclasses.dataclass
class _Session:
  page: str = "search"  # search | results | item | sub | done
  keywords: str | None = None
  results: tuple[int, ...] = ()  # catalogue positions of the top hits
  page_no: int = 1
  asin: str | None = None
  options: dict[str, str] = dataclasses.field(default_factory=dict)
  sub: str | None = None


@register_env("webshop", revision=1)
class WebShopTextEnv(TextEnv):
  """WebShop's text mode; see the module docstring for what is faithful."""

  splits = ("train", "eval", "test")

  def __init__(self, source: str = "generated", data_dir: str | None = None,
               goals: str | None = None, seed: int = 0, num_products: int | None = None,
               step_limit: int = 15, split_bounds=catalog.SPLIT_BOUNDS,
               families_per_type: int = 20, family_size: int = 5):
    if source not in ("generated", "real"):
      raise ValueError(f"source={source!r}; valid: generated, real")
    if source == "real":
      data_dir = data_dir or os.environ.get("WEBSHOP_DATA")
      if not data_dir:
        raise catalog.DataError("source='real' needs data_dir=DIR or WEBSHOP_DATA "
                                "(WebShop's items_shuffle/items_ins_v2 JSON files)")
    goals = goals or ("human" if source == "real" else "synthetic")
    if goals not in ("human", "synthetic"):
      raise ValueError(f"goals={goals!r}; valid: human, synthetic")
    if source == "generated" and goals == "human":
      raise ValueError("the generated catalogue has synthetic goals only")
    if not isinstance(step_limit, int) or step_limit < 1:
      raise ValueError(f"step_limit={step_limit!r}; must be a positive integer")
    self.source = source
    self._step_limit = step_limit
    self.world = get_world(source, data_dir, goals, seed, num_products,
                           tuple(int(b) for b in split_bounds), families_per_type, family_size)
    self._goal: dict[str, Any] | None = None
    self._done = True
    self._plans: dict[tuple[str, int], tuple[str, int, dict[str, str]] | None] = {}

  # ---- tasks --------------------------------------------------------------------------------

  def num_tasks(self, split: str) -> int:
    if split not in self.world.goals:
      raise ValueError(f"unknown split {split!r}; valid: {', '.join(self.splits)}")
    return len(self.world.goals[split])

  def goal(self, split: str, index: int) -> dict[str, Any]:
    n = self.num_tasks(split)
    if not isinstance(index, int) or not 0 <= index < n:
      raise IndexError(f"index {index!r} out of range for split {split!r} with {n} tasks")
    return self.world.goals[split][index]

  def reset(self, split: str, index: int) -> StepResult:
    self._goal = self.goal(split, index)
    self._task = (split, index)
    self._s = _Session()
    self._steps = 0
    self._done = False
    self._last_reward: dict[str, Any] = {}
    self._dist = self.expert_distance()
    return self._result(self._render(), 0.0, True, None)

  # ---- pages --------------------------------------------------------------------------------

  def _product(self, asin: str) -> dict[str, Any]:
    return self.world.products[self.world.by_asin[asin]]

  def _page_items(self) -> tuple[int, ...]:
    s = self._s
    return s.results[(s.page_no - 1) * PRODUCT_WINDOW:s.page_no * PRODUCT_WINDOW]

  def clickables(self) -> dict[str, tuple[str, Any]]:
    """Lower-case element text -> (kind, payload) for the current page (upstream's dict)."""
    s, out = self._s, {}
    if s.page == "results":
      out[BACK] = ("back", None)
      if s.page_no > 1:
        out[PREV] = ("prev", None)
      if s.page_no * PRODUCT_WINDOW < len(s.results):
        out[NEXT] = ("next", None)
      for i in self._page_items():
        out[self.world.products[i]["asin"].lower()] = ("product", self.world.products[i]["asin"])
    elif s.page == "item":
      out[BACK], out[PREV] = ("back", None), ("prev", None)
      for name, values in self._product(s.asin)["options"].items():
        for v in values:
          out[v] = ("option", name)
      for key in SUB_PAGES:
        out[key] = ("sub", key)
      out[BUY] = ("buy", None)
    elif s.page == "sub":
      out[BACK], out[PREV] = ("back", None), ("prev", None)
    return out

  def _render(self) -> str:
    s, g = self._s, self._goal
    head = ["Instruction:", g["instruction_text"]]
    if s.page == "search":
      return SEP.join(["WebShop", *head, "Search"])
    if s.page == "results":
      texts = [*head, "Back to Search", f"Page {s.page_no} (Total results: {len(s.results)})"]
      clicks = self.clickables()
      texts += [t for t in ("< Prev", "Next >") if t.lower() in clicks]
      for i in self._page_items():
        p = self.world.products[i]
        texts += [p["asin"], p["Title"], p["Price"]]
      return SEP.join(texts)
    p = self._product(s.asin)
    texts = [*head, "Back to Search", "< Prev"]
    if s.page == "item":
      for name, values in p["options"].items():
        texts += [name, *values]
      texts += [p["Title"], f"Price: {p['Price']}", f"Rating: {p['Rating']}",
                "Description", "Features", "Reviews", "Buy Now"]
    elif s.sub == "description":
      texts.append(p["Description"])
    elif s.sub == "features":
      texts += p["BulletPoints"]
    else:
      for r in p["Reviews"]:
        texts += [r["title"], str(r["score"]), r["body"]]
    return SEP.join(t for t in texts if t)

  def _admissible(self) -> tuple[str, ...]:
    if self._done:
      return ()
    if self._s.page == "search":
      return ("search[<your query>]",)
    return tuple(f"click[{k}]" for k in self.clickables())

  # ---- step ---------------------------------------------------------------------------------

  def step(self, action: str) -> StepResult:
    if self._goal is None or self._done:
      raise RuntimeError("step() called before reset() or after the episode ended")
    if not isinstance(action, str):
      raise TypeError(f"action must be a string, got {type(action).__name__}")
    self._steps += 1
    before = self._dist
    error, r = self._apply(action.strip())
    limit = self._steps >= self._step_limit
    bought = self._s.page == "done"
    self._done = bought or limit
    won = bought and r >= 1.0 - 1e-9
    if error is None:
      self._dist = self.expert_distance()
      label = float(before - self._dist) if not bought or won else -1.0
    else:
      label = 0.0
    obs = self._render() if not bought else self._done_page(r)
    if error is not None:
      obs = f"Invalid action: {error}\n{obs}"
    return self._result(obs, r, error is None, label, won=won, truncated=limit and not bought)

  def _apply(self, action: str) -> tuple[str | None, float]:
    """Changes the session; (why the action is invalid or None, reward)."""
    if len(action) > 2000:  # upstream would parse it; nothing that long is on a page
      return "the action is longer than 2000 characters.", 0.0
    m = _ACTION.match(action)
    if m is None:
      return "write search[keywords] or click[element].", 0.0
    name, arg = m.group(1), m.group(2).lower()
    if name == "search":
      if not arg.strip():
        return "the search keywords are empty.", 0.0
      s = self._s
      s.page, s.keywords, s.page_no, s.asin, s.options = "results", arg, 1, None, {}
      s.results = tuple(self.world.index.search(" ".join(arg.split(" ")), SEARCH_RETURN_N))
      return None, 0.0
    if name != "click":
      return f"unknown action {_short(name)!r}; write search[keywords] or click[element].", 0.0
    clicks = self.clickables()
    if arg not in clicks:
      return f"there is no {_short(arg)!r} to click on this page.", 0.0
    kind, payload = clicks[arg]
    s = self._s
    if kind == "back":
      self._s = _Session()
    elif kind == "next":
      s.page_no += 1
    elif kind == "prev":
      if s.page == "results":
        s.page_no -= 1
      elif s.page == "item":
        s.page = "results"
      else:
        s.page, s.sub = "item", None
    elif kind == "product":
      s.page, s.asin = "item", payload
    elif kind == "option":
      s.options[payload] = arg
    elif kind == "sub":
      s.page, s.sub = "sub", payload
    else:  # buy
      p = self._product(s.asin)
      r, parts = reward.get_reward(p, self._goal, self.world.prices[s.asin], s.options)
      self._last_reward = parts
      s.page = "done"
      return None, r
    return None, 0.0

  def _done_page(self, r: float) -> str:
    s = self._s
    return SEP.join(["Thank you for shopping with us!", "Purchased", s.asin,
                     json.dumps(s.options), "Your score (min 0.0, max 1.0)", f"{r:.4f}"])

  def _result(self, obs: str, r: float, valid: bool, label: float | None, won: bool = False,
              truncated: bool = False) -> StepResult:
    s = self._s
    split, index = self._task
    anchor = "|".join([s.page, s.keywords or "", str(s.page_no), s.asin or "",
                       json.dumps(s.options, sort_keys=True), s.sub or ""])
    extra = {"source": self.source, "split": split, "index": index,
             "asin": self._goal["asin"], "page": s.page, **self._last_reward}
    info = StepInfo(task=self._goal["instruction_text"], admissible_actions=self._admissible(),
                    anchor=anchor, won=won, action_valid=valid, oracle_label=label,
                    truncated=truncated, extra=extra)
    return StepResult(observation=obs, reward=float(r), done=self._done, info=info)

  # ---- expert -------------------------------------------------------------------------------

  def plan(self) -> tuple[str, int, dict[str, str]] | None:
    """(expert query, results page of the target, {option name: value} to choose)."""
    if self._task not in self._plans:
      g = self._goal
      p = self._product(g["asin"])
      page = None
      for query in (expert_query(g["instruction_text"]), p["Title"].lower()):
        query = query.lower()
        hits = self.world.index.search(query, SEARCH_RETURN_N)
        pos = self.world.by_asin[g["asin"]]
        if pos in hits:
          page = hits.index(pos) // PRODUCT_WINDOW + 1
          break
      self._plans[self._task] = None if page is None else (query, page, _choose(p, g))
    return self._plans[self._task]

  def _routes(self) -> list[tuple[int, str]]:
    """(steps to a win, first action) of each way the expert's plan can continue."""
    plan, s = self.plan(), self._s
    if plan is None or s.page == "done":
      return []
    query, target_page, want = plan
    target = self._goal["asin"]
    needed = [v for k, v in want.items() if s.options.get(k) != v]
    finish = len(needed) + 1
    first_finish = f"click[{needed[0]}]" if needed else f"click[{BUY}]"
    routes = [(1 + (target_page - 1) + 1 + len(want) + 1, f"search[{query}]")]
    if s.page in ("item", "sub") and s.asin == target:
      routes.append((finish, first_finish) if s.page == "item" else
                    (1 + finish, f"click[{PREV}]"))
    if s.page in ("results", "item", "sub"):
      pos = self.world.by_asin[target]
      if pos in s.results:
        q = s.results.index(pos) // PRODUCT_WINDOW + 1
        up = {"results": 0, "item": 1, "sub": 2}[s.page]
        if s.page == "results":
          first = (f"click[{target.lower()}]" if q == s.page_no else
                   f"click[{NEXT if q > s.page_no else PREV}]")
        else:
          first = f"click[{PREV}]"
        routes.append((up + abs(q - s.page_no) + 1 + finish, first))
    return routes

  def expert_distance(self) -> int:
    """Steps to a win along the expert's plan (0 once won; a large number if lost)."""
    if self._s.page == "done":
      return 0
    routes = self._routes()
    return min(d for d, _ in routes) if routes else 10**6

  def expert_action(self) -> str | None:
    if self._goal is None or self._done:
      return None
    routes = self._routes()
    return min(routes, key=lambda r: r[0])[1] if routes else None


def _choose(product: dict[str, Any], goal: dict[str, Any]) -> dict[str, str]:
  """The product's option values that best match the goal options (exact, else fuzzy > 85)."""
  wanted = (list(goal["goal_options"].values()) if isinstance(goal["goal_options"], dict)
            else list(goal["goal_options"]))
  value_owner = {}
  for name, values in product["options"].items():
    for v in values:
      value_owner[v] = name  # a value offered twice selects the later option (as clicking does)
  out: dict[str, str] = {}
  for w in wanted:
    if w in value_owner:
      out[value_owner[w]] = w
      continue
    best = max(((reward.token_set_ratio(w, v), v) for v in value_owner), default=(0, None))
    if best[0] > reward.FUZZY_THRESHOLD and value_owner[best[1]] not in out:
      out[value_owner[best[1]]] = best[1]
  return out


def _short(text: str, n: int = 40) -> str:
  return text if len(text) <= n else text[:n] + "..."
