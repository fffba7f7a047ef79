"""BM25 product search in pure Python, standing in for WebShop's Lucene index (pyserini).

Faithful: the indexed text is what WebShop's `convert_product_file_format.py` puts in a
document (title, description, first bullet point and the options as "name: a, and b",
lower-cased); the scoring is Lucene's BM25 with k1 = 0.9, b = 0.4 (pyserini's defaults):
idf = ln(1 + (N - df + 0.5) / (df + 0.5)), term weight tf / (tf + k1 (1 - b + b dl / avgdl))
(Lucene 8+ drops the constant (k1 + 1) factor, which does not change the ranking); the top 50
hits are returned, as SEARCH_RETURN_N.

Differs: tokens are lower-cased alphanumeric runs with English stop words removed, with no
Porter stemming ("bags" does not match "bag") and document lengths counted exactly (Lucene
quantises them to one byte), so scores and the order of near ties can differ from the Java
engine. Ties are broken by catalogue order (Lucene breaks them by document id, which is
indexing order too). None of this changes the task or the reward, only which 50 products a
given query lists.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from typing import Sequence

K1 = 0.9
B = 0.4
SEARCH_RETURN_N = 50

# Lucene's EnglishAnalyzer stop set.
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with".split())
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
  return [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]


class BM25Index:
  """An inverted index over documents given in catalogue order; `search` returns positions."""

  def __init__(self, docs: Sequence[str], k1: float = K1, b: float = B):
    self.k1, self.b = k1, b
    self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
    self.lengths: list[int] = []
    for i, text in enumerate(docs):
      tokens = tokenize(text)
      self.lengths.append(len(tokens))
      counts: dict[str, int] = defaultdict(int)
      for t in tokens:
        counts[t] += 1
      for t, c in counts.items():
        self.postings[t].append((i, c))
    self.postings = dict(self.postings)  # lookups of unknown terms must not add keys
    self.n = len(self.lengths)
    self.avgdl = (sum(self.lengths) / self.n) if self.n else 1.0
    self._cache: dict[str, list[tuple[int, float]]] = {}

  def idf(self, term: str) -> float:
    df = len(self.postings.get(term, ()))
    return math.log(1.0 + (self.n - df + 0.5) / (df + 0.5))

  def scores(self, query: str) -> dict[int, float]:
    """Document position -> BM25 score, for documents sharing a term with the query."""
    out: dict[int, float] = defaultdict(float)
    for term in tokenize(query):  # a repeated query term counts again, as in Lucene
      for doc, w in self._weights(term):
        out[doc] += w
    return out

  def _weights(self, term: str) -> list[tuple[int, float]]:
    """(doc, idf * tf / (tf + k1 (1 - b + b dl / avgdl))) per posting, computed once a term."""
    if term not in self.postings:
      return []  # not cached: unknown terms (typos, noise) would grow the cache without bound
    cached = self._cache.get(term)
    if cached is None:
      idf = self.idf(term)
      k1, b, avgdl = self.k1, self.b, self.avgdl
      cached = [(doc, idf * tf / (tf + k1 * (1.0 - b + b * self.lengths[doc] / avgdl)))
                for doc, tf in self.postings.get(term, ())]
      self._cache[term] = cached
    return cached

  def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
    scored = self.scores(query)
    return heapq.nsmallest(k, scored, key=lambda d: (-scored[d], d))
