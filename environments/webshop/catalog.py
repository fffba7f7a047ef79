"""WebShop's products and goals: loaded from the published JSON files, or generated.

The real files (from the WebShop repository's `setup.sh` downloads), in `data_dir`:
  items_shuffle_1000.json (or items_shuffle.json): a list of scraped products, each with
      asin, name, full_description, small_description (bullet points, a list or a string),
      pricing ("$12.99" or "$10.00 - $20.00"), customization_options ({name: [{value,
      image}]} or null), images, query, category, product_category ("A › B › C");
  items_ins_v2_1000.json (or items_ins_v2.json): {asin: {attributes, instruction,
      instruction_attributes}}: mined attributes and the synthetic instruction;
  items_human_ins.json: {asin: [{instruction, instruction_attributes, instruction_options}]}:
      the 12k human instructions (`goals="human"`, the benchmark's default);
  reviews.json (optional): [{asin, reviews: [{title, stars or score, review}],
      average_rating}].
`load_products` turns them into the product records of WebShop's `engine.load_products`
(Title, Description, BulletPoints, Reviews, Rating, pricing, Price, options, Attributes,
query, category, product_category, name), and `human_goals` / `synthetic_goals` build the
goals as `engine/goal.py` does; `split_goals` shuffles them with seed 233 and cuts the
standard splits: test = goals 0-499, eval = 500-1499, train = 1500+ (the protocol's split
names "test", "eval", "train").

Differs: upstream draws a product's price within a range and each goal's price limit from
Python's global random state, unseeded, so they change from run to run; here both come from
a `random.Random` seeded by the asin (and `seed`), so a (split, index) is always the same task.

`generate_raw(seed, ...)` writes a catalogue in the same raw format (so the generated source
goes through the same loader): product types in WebShop's five categories, each with many
near-duplicate products (same type and most attributes, different brand, one attribute,
options or price), attributes mined the way items_ins_v2 holds them, and one instruction
for about a third of the products, "i am looking for <attrs> <type>" as WebShop's synthetic
instructions read. Published WebShop scores are not comparable with it.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import random
import re
from decimal import Decimal
from typing import Any

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
GOAL_SHUFFLE_SEED = 233
SPLIT_BOUNDS = (500, 1500)  # test = [0, 500), eval = [500, 1500), train = [1500, ...)


class DataError(ValueError):
  """The WebShop data directory is missing or not in the published format."""


# ---- the published files -------------------------------------------------------------------

def _find(data_dir: str, stems: tuple[str, ...]) -> str | None:
  for stem in stems:
    path = os.path.join(data_dir, stem)
    if os.path.exists(path):
      return path
  return None


def read_raw(data_dir: str) -> dict[str, Any]:
  """The JSON files of a WebShop data directory, as published."""
  if not os.path.isdir(data_dir):
    raise DataError(f"no WebShop data directory at {data_dir!r} (set data_dir or WEBSHOP_DATA)")
  products = _find(data_dir, ("items_shuffle_1000.json", "items_shuffle.json")) or next(
      iter(sorted(glob.glob(os.path.join(data_dir, "items_shuffle*.json")))), None)
  attrs = _find(data_dir, ("items_ins_v2_1000.json", "items_ins_v2.json")) or next(
      iter(sorted(glob.glob(os.path.join(data_dir, "items_ins_v2*.json")))), None)
  if products is None or attrs is None:
    raise DataError(f"{data_dir!r} lacks items_shuffle*.json or items_ins_v2*.json "
                    "(WebShop's setup.sh downloads them)")
  out: dict[str, Any] = {}
  for key, path in (("products", products), ("attributes", attrs),
                    ("human", _find(data_dir, ("items_human_ins.json",))),
                    ("reviews", _find(data_dir, ("reviews.json",)))):
    if path is None:
      out[key] = None
      continue
    with open(path, encoding="utf-8") as f:
      out[key] = json.load(f)
  return out


def _parse_pricing(pricing: str | None) -> tuple[list[float], str]:
  if not pricing:
    return [100.0], "$100.0"
  values = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
  if len(values) == 1:
    return values, f"${values[0]}"
  return values[:2], f"${values[0]} to ${values[1]}"


def load_products(raw: dict[str, Any], num_products: int | None = None,
                  human_goals: bool = True) -> list[dict[str, Any]]:
  """Product records as WebShop's `engine.load_products` makes them (minus images)."""
  reviews, ratings = {}, {}
  for r in raw.get("reviews") or []:
    reviews[r["asin"]] = r["reviews"]
    ratings[r["asin"]] = r["average_rating"]
  attributes = raw["attributes"]
  human = raw.get("human") or {}
  products = raw["products"][:num_products] if num_products else raw["products"]
  seen, out = set(), []
  for p in products:
    asin = p["asin"]
    if asin == "nan" or len(asin) > 10 or asin in seen:
      continue
    seen.add(asin)
    pricing, price_tag = _parse_pricing(p.get("pricing"))
    options: dict[str, list[str]] = {}
    for name, contents in (p.get("customization_options") or {}).items():
      if contents is None:
        continue
      options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    bullets = p["small_description"]
    rec = {
        "asin": asin, "name": p["name"], "Title": p["name"],
        "Description": p["full_description"],
        "BulletPoints": bullets if isinstance(bullets, list) else [bullets],
        "Reviews": [{"title": r.get("title", ""), "score": r.get("score", r.get("stars")),
                     "body": r.get("review", r.get("body", ""))}
                    for r in reviews.get(asin, [])],
        "Rating": ratings.get(asin, "N.A."),
        "pricing": pricing, "Price": price_tag, "options": options,
        "Attributes": (attributes[asin]["attributes"]
                       if asin in attributes and "attributes" in attributes[asin]
                       else ["DUMMY_ATTR"]),
        "query": p["query"].lower().strip(), "category": p["category"],
        "product_category": p["product_category"],
    }
    if human_goals:
      if asin in human:
        rec["instructions"] = human[asin]
    elif asin in attributes:
      rec["instruction_text"] = attributes[asin].get("instruction")
      rec["instruction_attributes"] = attributes[asin].get("instruction_attributes")
    out.append(rec)
  return out


def product_price(product: dict[str, Any], seed: int) -> float:
  """The price paid: the listed one, or a draw within a listed range (as upstream)."""
  pricing = product["pricing"]
  if len(pricing) == 1:
    return pricing[0]
  return random.Random(f"{seed}:price:{product['asin']}").uniform(*pricing[:2])


def _price_limit(asin: str, price: float, seed: int, salt: str) -> tuple[float, str]:
  above = [p for p in PRICE_RANGE if p > price][:4]
  if len(above) < 2:
    return 1_000_000.0, ""
  _, upper = sorted(random.Random(f"{seed}:limit:{asin}:{salt}").sample(above, 2))
  return upper, f", and price lower than {upper:.2f} dollars"


def _goal(p: dict[str, Any], text: str, attrs, options, upper: float) -> dict[str, Any]:
  return {"asin": p["asin"], "category": p["category"], "query": p["query"],
          "name": p["name"], "product_category": p["product_category"],
          "instruction_text": text, "attributes": list(attrs), "price_upper": upper,
          "goal_options": options}


def human_goals(products: list[dict[str, Any]], prices: dict[str, float],
                seed: int) -> list[dict[str, Any]]:
  """`goal.get_human_goals`: one goal per human instruction with attributes."""
  goals = []
  for p in products:
    for k, ins in enumerate(p.get("instructions", ())):
      if not ins["instruction_attributes"]:
        continue
      upper, price_text = _price_limit(p["asin"], prices[p["asin"]], seed, str(k))
      goals.append(_goal(p, ins["instruction"].strip(".") + price_text,
                         ins["instruction_attributes"], list(ins["instruction_options"]), upper))
  return goals


def synthetic_goals(products: list[dict[str, Any]], prices: dict[str, float],
                    seed: int) -> list[dict[str, Any]]:
  """`goal.get_synthetic_goals`: one goal per option combination of each instructed product."""
  goals = []
  for p in products:
    if p.get("instruction_text") is None:
      continue
    upper, price_text = _price_limit(p["asin"], prices[p["asin"]], seed, "")
    names = sorted(p["options"])
    for combo in itertools.product(*(p["options"][n] for n in names)):
      chosen = dict(zip(names, combo))
      option_text = ", and ".join(f"{k}: {v}" for k, v in chosen.items())
      option_text = " with " + option_text if option_text else ""
      goals.append(_goal(p, f"{p['instruction_text']}{option_text}{price_text}",
                         p["instruction_attributes"], chosen, upper))
  return goals


def split_goals(goals: list[dict[str, Any]],
                bounds: tuple[int, int] = SPLIT_BOUNDS) -> dict[str, list[dict[str, Any]]]:
  """Shuffled with WebShop's seed 233, then test / eval / train by index."""
  goals = list(goals)
  random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
  lo, hi = bounds
  return {"test": goals[:lo], "eval": goals[lo:hi], "train": goals[hi:]}


# ---- the generated catalogue ---------------------------------------------------------------

# category -> (breadcrumb root, [(product type, query, sub-category, attributes, options,
# price range)]); attributes are phrases as WebShop mines them; options are (name, values).
_COLORS = ["black", "white", "navy blue", "red", "grey", "pink", "green", "beige", "brown",
           "purple"]
_SIZES = ["small", "medium", "large", "x-large", "xx-large"]
_TYPES: dict[str, tuple[str, list[tuple]]] = {
    "beauty": ("Beauty & Personal Care", [
        ("shampoo", "shampoo", "Hair Care", ["sulfate free", "paraben free", "natural ingredients",
                                             "dry hair", "long lasting", "cruelty free"],
         [("size", ["8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz"]),
          ("scent", ["lavender", "coconut", "tea tree", "unscented"])], (6, 40)),
        ("hair extension", "hair extensions", "Hair Care",
         ["natural looking", "high quality", "easy apply", "heat resistant", "synthetic hair"],
         [("color", ["black", "dark brown", "blonde", "auburn"]),
          ("size", ["14 inch", "18 inch", "22 inch"])], (12, 90)),
        ("lipstick", "lipstick", "Makeup", ["long lasting", "cruelty free", "matte finish",
                                            "paraben free", "high quality"],
         [("color", ["ruby red", "nude pink", "berry", "coral"])], (5, 30)),
        ("face moisturizer", "moisturizer", "Skin Care",
         ["dry skin", "fragrance free", "anti aging", "hyaluronic acid", "sensitive skin"],
         [("size", ["1.7 oz", "3.4 oz"])], (9, 60)),
        ("makeup brush set", "makeup brushes", "Tools & Accessories",
         ["high quality", "easy clean", "soft bristles", "travel size", "vegan"],
         [("color", ["rose gold", "black", "pink"])], (7, 45)),
        ("nail polish", "nail polish", "Nail Care",
         ["quick dry", "non toxic", "long lasting", "high gloss"],
         [("color", ["red", "pink", "navy blue", "white", "black"])], (4, 20)),
    ]),
    "grocery": ("Grocery & Gourmet Food", [
        ("snack bar", "snack bars", "Snack Foods", ["gluten free", "low sugar", "high protein",
                                                    "non gmo", "keto friendly", "plant based"],
         [("flavor name", ["chocolate", "peanut butter", "almond", "blueberry"]),
          ("size", ["12 count", "24 count"])], (8, 40)),
        ("coffee beans", "coffee", "Beverages", ["dark roast", "fair trade", "usda organic",
                                                 "low acid", "decaf"],
         [("size", ["12 ounce", "2 pound", "5 pound"])], (9, 70)),
        ("herbal tea", "tea", "Beverages", ["caffeine free", "usda organic", "non gmo",
                                            "natural ingredients"],
         [("flavor name", ["chamomile", "peppermint", "ginger", "hibiscus"]),
          ("size", ["20 count", "100 count"])], (4, 30)),
        ("beef jerky", "jerky", "Meat Snacks", ["high protein", "low fat", "gluten free",
                                                "keto friendly", "grass fed"],
         [("flavor name", ["original", "teriyaki", "spicy", "black pepper"])], (6, 45)),
        ("olive oil", "olive oil", "Pantry Staples", ["extra virgin", "cold pressed",
                                                      "usda organic", "non gmo"],
         [("size", ["16.9 fl oz", "33.8 fl oz", "101 fl oz"])], (8, 60)),
        ("gummy candy", "candy", "Candy & Chocolate", ["gluten free", "fat free", "vegan",
                                                       "individually wrapped"],
         [("flavor name", ["sour", "fruit", "cherry"]), ("size", ["1 pound", "5 pound"])],
         (3, 30)),
    ]),
    "fashion": ("Clothing, Shoes & Jewelry", [
        ("t-shirt", "mens t shirts", "Men › Clothing", ["machine wash", "short sleeve",
                                                        "cotton spandex", "regular fit",
                                                        "quick drying"],
         [("color", _COLORS[:6]), ("size", _SIZES)], (8, 35)),
        ("running shoe", "running shoes", "Women › Shoes", ["non slip", "rubber sole",
                                                            "lace up", "arch support",
                                                            "memory foam"],
         [("color", _COLORS[:5]), ("size", ["6", "7", "8", "9", "10"])], (25, 120)),
        ("yoga pants", "yoga pants", "Women › Clothing", ["high waist", "tummy control",
                                                          "quick drying", "machine wash",
                                                          "butt lifting"],
         [("color", _COLORS[:6]), ("size", _SIZES[:4])], (12, 45)),
        ("winter jacket", "jackets", "Men › Clothing", ["water resistant", "fleece lined",
                                                        "long sleeve", "zip closure",
                                                        "hand wash"],
         [("color", _COLORS[:4]), ("size", _SIZES)], (35, 160)),
        ("dress", "dresses", "Women › Clothing", ["machine wash", "short sleeve", "elastic waist",
                                                  "polyester spandex", "button closure"],
         [("color", _COLORS[3:9]), ("size", _SIZES[:4])], (18, 70)),
        ("slipper", "slippers", "Women › Shoes", ["memory foam", "non slip", "rubber sole",
                                                  "faux fur", "open toe"],
         [("color", _COLORS[:5]), ("size", ["6-7", "8-9", "10-11"])], (10, 40)),
    ]),
    "electronics": ("Electronics", [
        ("bluetooth speaker", "bluetooth speaker", "Portable Audio",
         ["water resistant", "long battery life", "high power", "easy carry", "stereo sound"],
         [("color", ["black", "blue", "red"])], (15, 120)),
        ("usb c cable", "usb c cable", "Cables", ["fast charging", "high speed", "nylon braided",
                                                  "easy use"],
         [("size", ["3 ft", "6 ft", "10 ft"]), ("color", ["black", "white"])], (5, 25)),
        ("hdmi cable", "hdmi cable", "Cables", ["high speed", "gold plated", "4k ultra hd",
                                                "easy install"],
         [("size", ["3 feet", "6 feet", "15 feet"])], (6, 35)),
        ("wireless earbuds", "earbuds", "Headphones", ["noise cancelling", "long battery life",
                                                       "water resistant", "wireless charging",
                                                       "hands free"],
         [("color", ["black", "white", "navy blue"])], (20, 150)),
        ("phone case", "phone case", "Cell Phone Accessories",
         ["shock absorbing", "wireless charging", "slim fit", "easy install", "glass screen"],
         [("color", ["black", "clear", "pink", "green"])], (6, 30)),
        ("security camera", "security camera", "Camera & Photo",
         ["night vision", "motion detection", "easy install", "two way audio", "1080p hd"],
         [("size", ["1 pack", "2 pack", "4 pack"])], (25, 180)),
    ]),
    "garden": ("Home & Kitchen", [
        ("throw pillow cover", "pillow covers", "Bedding", ["machine washable", "double sided",
                                                            "living room", "zipper closure",
                                                            "super soft"],
         [("color", _COLORS[:7]), ("size", ["18 x 18 inch", "20 x 20 inch"])], (8, 30)),
        ("office chair", "office chair", "Furniture", ["lumbar support", "easy assemble",
                                                       "height adjustable", "heavy duty",
                                                       "high density"],
         [("color", ["black", "grey", "white"])], (60, 300)),
        ("bed sheet set", "sheets", "Bedding", ["deep pocket", "machine washable", "easy care",
                                                "queen size", "wrinkle free"],
         [("color", _COLORS[:6]), ("size", ["twin", "full", "queen", "king"])], (20, 90)),
        ("led floor lamp", "floor lamp", "Lighting", ["living room", "energy saving",
                                                      "easy assemble", "remote control",
                                                      "dimmable"],
         [("color", ["black", "white", "gold"])], (30, 150)),
        ("bath towel set", "towels", "Bath", ["highly absorbent", "quick drying", "machine wash",
                                              "super soft", "hotel quality"],
         [("color", _COLORS[:8])], (15, 70)),
        ("storage shelf", "shelves", "Furniture", ["easy assemble", "space saving", "heavy duty",
                                                   "wood finish", "living room"],
         [("color", ["white", "brown", "black"]), ("size", ["3 tier", "4 tier", "5 tier"])],
         (25, 140)),
    ]),
}
_BRANDS = ["Acme", "Nova", "Zenith", "Apex", "Lumen", "Orion", "Vela", "Kestrel", "Maple",
           "Cobalt", "Harbor", "Summit", "Willow", "Pioneer", "Aurora", "Everest", "Juniper",
           "Beacon", "Solace", "Tundra", "Marlow", "Quill", "Ridge", "Sable"]
_EXTRAS = ["premium", "classic", "deluxe", "essential", "pro", "plus", "original", "ultra",
           "everyday", "signature"]
_REVIEW_BODIES = ["works as described", "good value for the price", "arrived quickly",
                  "not what i expected", "would buy again", "quality could be better",
                  "my family loves it", "exactly as pictured"]


def _asin(rng: random.Random, used: set[str]) -> str:
  while True:
    asin = "B0" + "".join(rng.choice("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(8))
    if asin not in used:
      used.add(asin)
      return asin


def generate_raw(seed: int = 0, families_per_type: int = 20,
                 family_size: int = 5) -> dict[str, Any]:
  """A catalogue in WebShop's published file format (see the module docstring).

  Each product type gets `families_per_type` families of `family_size` near duplicates:
  same type and brand line, attributes drawn around a family core, options and price
  varied; 30 types x 20 x 5 = 3,000 products by default.
  """
  rng = random.Random(f"webshop-generated:{seed}")
  used: set[str] = set()
  products, attributes, reviews = [], {}, []
  for category, (root, types) in _TYPES.items():
    for ptype, query, sub, attrs, options, (lo, hi) in types:
      for _ in range(families_per_type):
        brand, extra = rng.choice(_BRANDS), rng.choice(_EXTRAS)
        core = rng.sample(attrs, 2)
        for _ in range(family_size):
          asin = _asin(rng, used)
          rest = [a for a in attrs if a not in core]
          p_attrs = core + rng.sample(rest, rng.randint(0, min(2, len(rest))))
          shown = [a for a in p_attrs if rng.random() < 0.7] or p_attrs[:1]
          title = f"{brand} {extra.title()} {' '.join(a.title() for a in shown)} {ptype.title()}"
          price = rng.uniform(lo, hi)
          pricing = (f"${price:.2f}" if rng.random() < 0.8
                     else f"${price:.2f} - ${price * rng.uniform(1.1, 1.5):.2f}")
          p_options = {}
          for name, values in options:
            k = rng.randint(min(2, len(values)), len(values))
            chosen = sorted(rng.sample(values, k), key=values.index)
            p_options[name] = [{"value": v, "image": None} for v in chosen]
          bullets = [f"{a.capitalize()}: this {ptype} is {a}." for a in p_attrs]
          bullets.append(f"Made by {brand}; satisfaction guaranteed.")
          products.append({
              "asin": asin, "name": title,
              "full_description": (f"The {brand} {extra} {ptype} from our {sub.lower()} line. "
                                   f"{' '.join(b for b in bullets[:-1])}"),
              "small_description": bullets, "pricing": pricing,
              "customization_options": p_options, "images": [""], "query": query,
              "category": category, "product_category": f"{root} › {sub} › {ptype.title()}",
          })
          ins_attrs = rng.sample(p_attrs, min(len(p_attrs), rng.randint(1, 2)))
          entry = {"attributes": p_attrs}
          if rng.random() < 1 / 3:
            article = "an" if ins_attrs[0][0] in "aeiou" else "a"
            entry["instruction"] = (f"i am looking for {article} {' and '.join(ins_attrs)} "
                                    f"{ptype}")
            entry["instruction_attributes"] = ins_attrs
          attributes[asin] = entry
          stars = [rng.randint(1, 5) for _ in range(rng.randint(0, 3))]
          reviews.append({"asin": asin, "average_rating": (round(sum(stars) / len(stars), 1)
                                                           if stars else "N.A."),
                          "reviews": [{"title": rng.choice(["Great", "Okay", "Meh"]),
                                       "stars": s, "review": rng.choice(_REVIEW_BODIES)}
                                      for s in stars]})
  rng.shuffle(products)  # as items_shuffle.json
  return {"products": products, "attributes": attributes, "human": None, "reviews": reviews}
