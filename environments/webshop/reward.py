"""WebShop's reward at "Buy Now" (Yao et al., 2022, Sec. 3.2; `web_agent_site/engine/goal.py`).

    reward = r_type * (matched attributes + matched options + [price <= price_upper])
             / (number of goal attributes + number of goal options + 1)

Faithful:
  * attribute matching: a goal attribute matches when some product attribute has a fuzzy
    token-set ratio above 85 with it, or else when it occurs (as a substring) in the
    lower-cased title, bullet points or description;
  * option matching counts the *purchased* options: an option named "size" must equal a
    goal option exactly, any other must have token-set ratio above 85 with one, or else occur
    in the title, bullet points or description; both sides go through `normalize_color`;
  * r_type: 1, lowered to 0.5 when neither the search query, nor two product-category
    breadcrumbs, nor more than 0.2 of the goal name's nouns match, to 0.1 when fewer than
    0.1 of the nouns match and to 0 when none do; 0.2 when the goal name has no noun.
  * `token_set_ratio` is thefuzz's (rapidfuzz's) definition, written here in pure Python and
    tested against rapidfuzz on random strings: the strings are processed (lower case,
    non-alphanumerics to spaces), split into token sets, and the score is the best
    normalised Indel similarity (LCS based) among intersection vs intersection + rest of each
    side and the two rests, rounded; 100 when one set contains the other.
Differs:
  * the nouns of a product name come from spaCy's part-of-speech tagger (en_core_web_lg)
    upstream; here they are the name's alphabetic tokens that are not stop words or numbers
    (`name_nouns`). Buying the goal's own product scores r_type = 1 either way; for another
    product the title score can differ.
  * `normalize_color` maps a value to the first colour of a fixed list it contains, as
    upstream, with this project's own list of colours.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

EXACT_MATCH_OPTS = ("size",)
FUZZY_THRESHOLD = 85

_LATIN1 = {i: None for i in range(128, 256)}


def _process(s: str) -> str:
  """thefuzz's full_process with force_ascii: code points 128-255 deleted, then rapidfuzz's
  default_process (every non-alphanumeric character to a space, lower case, trimmed)."""
  return "".join(c if c.isalnum() else " " for c in s.translate(_LATIN1)).lower().strip()


def _lcs(a: str, b: str) -> int:
  if len(a) < len(b):
    a, b = b, a
  prev = [0] * (len(b) + 1)
  for ca in a:
    cur = [0]
    for j, cb in enumerate(b):
      cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
    prev = cur
  return prev[-1]


def _norm_sim(dist: int, lensum: int) -> float:
  return 100.0 * (1.0 - dist / lensum) if lensum else 100.0


def token_set_ratio(s1: str, s2: str) -> int:
  """fuzz.token_set_ratio as thefuzz computes it (rounded to an integer, 0-100)."""
  a, b = set(_process(s1).split()), set(_process(s2).split())
  if not a or not b:
    return 0
  sect = a & b
  diff_ab, diff_ba = " ".join(sorted(a - b)), " ".join(sorted(b - a))
  if sect and (not diff_ab or not diff_ba):
    return 100
  sect_len = len(" ".join(sorted(sect)))
  sep = 1 if sect_len else 0
  sect_ab_len, sect_ba_len = sect_len + sep + len(diff_ab), sect_len + sep + len(diff_ba)
  # Indel distance of "sect rest_a" vs "sect rest_b" is that of the two rests.
  dist = len(diff_ab) + len(diff_ba) - 2 * _lcs(diff_ab, diff_ba)
  best = _norm_sim(dist, sect_ab_len + sect_ba_len)
  if sect_len:
    best = max(best, _norm_sim(sep + len(diff_ab), sect_len + sect_ab_len),
               _norm_sim(sep + len(diff_ba), sect_len + sect_ba_len))
  return int(round(best))


# Shades before the basic colours they contain or are sold as ("navy blue" -> "navy").
COLORS = (
    "navy", "charcoal", "burgundy", "maroon", "turquoise", "teal", "lavender", "khaki", "ivory",
    "beige", "cream", "coral", "mint", "olive", "bronze", "silver", "gold", "rose", "tan",
    "black", "white", "blue", "brown", "gray", "grey", "green", "orange", "pink", "purple",
    "red", "yellow")


def normalize_color(value: str) -> str:
  for color in COLORS:
    if color in value:
      return color
  return value


STOP_WORDS = frozenset(
    "a an and are as at be but by for from if in into is it its no not of on or such that the "
    "their then there these they this to was will with without x pack count set pcs oz inch "
    "inches".split())


def name_nouns(name: str) -> list[str]:
  """Stand-in for spaCy's NOUN/PROPN tokens of a product name (see the module docstring)."""
  return [t for t in re.findall(r"[a-z]+", name.lower())
          if len(t) > 1 and t not in STOP_WORDS]


def type_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> dict[str, Any]:
  query_match = product["query"] == goal["query"]
  cats_p = {x.strip() for x in product["product_category"].split("›")}
  cats_g = {x.strip() for x in goal["product_category"].split("›")}
  category_match = len(cats_p & cats_g) >= 2
  purchased, desired = name_nouns(product["name"]), name_nouns(goal["name"])
  title_score = 0.2 if not desired else len(set(purchased) & set(desired)) / len(desired)
  r_type = 1.0
  if not (query_match or category_match or title_score > 0.2):
    r_type = 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  return dict(r_type=r_type, query_match=query_match, category_match=category_match,
              title_score=title_score)


def _in_text(value: str, product: Mapping[str, Any]) -> bool:
  return (value in product["Title"].lower()
          or value in " ".join(product["BulletPoints"]).lower()
          or value in product["Description"].lower())


def attribute_matches(product: Mapping[str, Any], goal_attrs: Sequence[str]) -> int:
  n = 0
  for g in goal_attrs:
    if any(token_set_ratio(p, g) > FUZZY_THRESHOLD for p in product["Attributes"]) or _in_text(
        g, product):
      n += 1
  return n


def option_matches(product: Mapping[str, Any], goal_options: Sequence[str],
                   purchased: Mapping[str, str]) -> int:
  goal = [normalize_color(o) for o in goal_options]
  n = 0
  for name, value in purchased.items():
    value = normalize_color(value)
    if name.lower() in EXACT_MATCH_OPTS:
      matched = value in goal
    else:
      matched = any(token_set_ratio(g, value) > FUZZY_THRESHOLD for g in goal)
    if matched or _in_text(value, product):
      n += 1
  return n


def get_reward(product: Mapping[str, Any], goal: Mapping[str, Any], price: float,
               options: Mapping[str, str]) -> tuple[float, dict[str, Any]]:
  """(reward, components) for buying `product` at `price` with `options` chosen."""
  rt = type_reward(product, goal)
  goal_options = list(goal["goal_options"].values()) if isinstance(
      goal["goal_options"], Mapping) else list(goal["goal_options"])
  r_price = price <= goal["price_upper"]
  n_attr = attribute_matches(product, goal["attributes"])
  n_opt = option_matches(product, goal_options, options)
  total = (n_attr + n_opt + r_price) / (len(goal["attributes"]) + len(goal_options) + 1)
  total *= rt["r_type"]
  return total, dict(rt, n_attr=n_attr, n_opt=n_opt, r_price=bool(r_price))
