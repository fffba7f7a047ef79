"""Training rows: loss exactly on action tokens, fixed shapes, every row once per epoch."""

import numpy as np
import pytest

from csa_jax.update import data as D


def test_row_arrays_against_a_loop():
  row = {"prompt_ids": [5, 6, 7], "action_ids": [8, 9, 1], "old_logps": [-0.1, -0.2, -0.3],
         "advantage": 1.5}
  a = D.row_arrays(row, seq_len=8, action_len=4)
  seq = [5, 6, 7, 8, 9, 1]
  for p in range(8):
    real = p < len(seq) - 1
    assert a["inputs"][p] == (seq[p] if real else 0)
    assert a["attn_mask"][p] == int(real)
  for k in range(4):
    if k < 3:  # action token k is seq[3 + k], predicted from input position 2 + k
      assert a["act_pos"][k] == 2 + k and a["inputs"][a["act_pos"][k]] == seq[2 + k]
      assert a["targets"][k] == seq[3 + k]
      assert a["loss_mask"][k] == 1.0 and a["adv"][k] == 1.5
      assert a["old_logp"][k] == pytest.approx(row["old_logps"][k])
    else:
      assert a["loss_mask"][k] == 0 and a["adv"][k] == 0 and a["old_logp"][k] == 0


@pytest.mark.parametrize("prompt, action", [(8, 3), (2, 5)])
def test_row_too_long_fails(prompt, action):
  with pytest.raises(ValueError, match="does not fit"):
    D.row_arrays({"prompt_ids": [1] * prompt, "action_ids": [2] * action,
                  "old_logps": [0] * action, "advantage": 0.0}, seq_len=8, action_len=4)


def test_batches_cover_each_row_once_per_epoch_and_pad():
  rows = [D.sft_row([2, 3 + i], [100 + i, 1]) for i in range(10)]
  ds = D.batches(rows, batch_size=4, seq_len=6, action_len=3, pad_id=0, seed=3, epochs=2)
  got = list(D.iterate(ds))
  assert len(got) == 6  # 10 rows padded to 12, two epochs, batches of 4
  for b in got:
    assert all(v.shape[0] == 4 for v in b.values())
  for epoch in (got[:3], got[3:]):
    seen = [int(b["targets"][r][0]) for b in epoch for r in range(4) if b["loss_mask"][r][0]]
    assert sorted(seen) == list(range(100, 110))
  orders = [[int(b["inputs"][r][1]) for b in e for r in range(4)] for e in (got[:3], got[3:])]
  assert orders[0] != orders[1]  # reshuffled each epoch


# ----------------------------------------------------------------------------------------
# Packing (optim.pack_rows).


def _rows(rng, n, max_prompt=10, max_action=3):
  rows = []
  for i in range(n):
    p = rng.integers(2, 60, size=int(rng.integers(1, max_prompt + 1))).tolist()
    a = rng.integers(2, 60, size=int(rng.integers(1, max_action + 1))).tolist()
    rows.append({"prompt_ids": p, "action_ids": a,
                 "old_logps": (-rng.random(len(a))).tolist(), "advantage": float(i)})
  return rows


def test_first_fit_against_a_loop():
  """Longest first, ties in order, each into the first bin with room; every bin within
  capacity, and the result a function of the lengths alone."""
  lens = [5, 3, 7, 2, 5, 1, 8, 4]
  where = D.first_fit(lens, 10)
  assert where == D.first_fit(list(lens), 10)
  # By hand: 8 -> b0 (2 left), 7 -> b1 (3), 5 -> b2 (5), 5 -> b2 (0), 4 -> b3 (6),
  # 3 -> b1 (0), 2 -> b0 (0), 1 -> b3 (5).
  assert where == [2, 1, 1, 0, 2, 3, 0, 3]
  for b in set(where):
    assert sum(n for n, w in zip(lens, where) if w == b) <= 10
  with pytest.raises(ValueError, match="does not fit"):
    D.first_fit([11], 10)


@pytest.mark.parametrize("micro", [1, 2])
def test_packed_batch_holds_each_row_as_it_is_alone(micro):
  """Every row's tokens, positions (from 0), one segment of its own, and act_idx pointing
  at the slots whose next token is its action token, in its micro-batch's sequences;
  the per-row arrays equal the unpacked ones."""
  rng = np.random.default_rng(0)
  rows = _rows(rng, 8) + [D.empty_row(0)] * 2 + _rows(rng, 2)
  L, A = 12, 3
  b = D.pack_rows(rows, seq_len=L, action_len=A, micro_batches=micro)
  assert set(b) == set(D.PACKED_KEYS)
  s = b["inputs"].shape[0]
  assert s % micro == 0 and b["act_idx"].shape == (len(rows), A)
  for r, row in enumerate(rows):
    alone = D.row_arrays(row, L, A)
    for k in ("targets", "loss_mask", "old_logp", "adv"):
      np.testing.assert_array_equal(b[k][r], alone[k])
    if not row["action_ids"]:
      continue
    seq = row["prompt_ids"] + row["action_ids"]
    j = r % micro
    flat = {k: b[k][j::micro].reshape(-1) for k in ("inputs", "positions", "segment_ids",
                                                       "attn_mask")}
    first = b["act_idx"][r, 0] - (len(row["prompt_ids"]) - 1)  # the row's first slot
    n = len(seq) - 1
    span = slice(first, first + n)
    assert first // L == (first + n - 1) // L  # within one sequence
    np.testing.assert_array_equal(flat["inputs"][span], seq[:-1])
    np.testing.assert_array_equal(flat["positions"][span], np.arange(n))
    assert (flat["attn_mask"][span] == 1).all()
    seg = flat["segment_ids"][span]
    assert seg[0] > 0 and (seg == seg[0]).all()
    same_seq = slice(first // L * L, first // L * L + L)
    assert (flat["segment_ids"][same_seq] == seg[0]).sum() == n  # nobody else's segment
    for a in range(len(row["action_ids"])):
      assert flat["inputs"][b["act_idx"][r, a]] == seq[len(row["prompt_ids"]) - 1 + a]


def test_packing_saves_slots_and_counts_tokens_like_numpy():
  """Short rows share sequences; token_counts matches a count over the rows, and for the
  unpacked batches it leaves out the padding rows' pad token."""
  rng = np.random.default_rng(1)
  rows = _rows(rng, 21)
  real = sum(len(r["prompt_ids"]) + len(r["action_ids"]) - 1 for r in rows)
  L, A, bs = 14, 3, 8
  packed = list(D.iterate(D.packed_batches(rows, batch_size=bs, seq_len=L, action_len=A,
                                           pad_id=0, seed=0, epochs=2)))
  plain = list(D.iterate(D.batches(rows, batch_size=bs, seq_len=L, action_len=A, pad_id=0,
                                   seed=0, epochs=2)))
  assert len(packed) == len(plain) == 6
  counts = np.array([D.token_counts(b) for b in packed]).sum(0)
  counts_plain = np.array([D.token_counts(b) for b in plain]).sum(0)
  assert counts[0] == counts_plain[0] == 2 * real
  assert counts_plain[1] == 6 * bs * L
  assert counts[1] == sum(b["inputs"].size for b in packed) < counts_plain[1]
  # The same rows in the same minibatches: per-row arrays equal batch by batch.
  for p, u in zip(packed, plain):
    for k in ("targets", "loss_mask", "old_logp", "adv"):
      np.testing.assert_array_equal(p[k], u[k])


def test_packing_is_deterministic():
  rows = _rows(np.random.default_rng(2), 30)
  kw = dict(batch_size=8, seq_len=14, action_len=3, pad_id=0, seed=5, epochs=1)
  one = list(D.iterate(D.packed_batches(rows, **kw)))
  two = list(D.iterate(D.packed_batches(list(rows), **kw)))
  for a, b in zip(one, two, strict=True):
    for k in D.PACKED_KEYS:
      np.testing.assert_array_equal(a[k], b[k])


def test_minibatches_take_the_counts_given_or_their_own_need():
  """Each minibatch packs into the count given for it (at least its need, else refused), or
  without counts into its own need, which is what it alone would take."""
  rows = _rows(np.random.default_rng(4), 45)
  kw = dict(batch_size=8, seq_len=14, pad_id=0, seed=3, epochs=2, micro_batches=2)
  alone = [D.pack_rows(mb, seq_len=14, action_len=3, micro_batches=2)["inputs"].shape[0]
           for mb in D._shuffled(rows, 8, 0, 3, 2).batch(8, drop_remainder=True, batch_fn=list)]
  assert len(set(alone)) > 1
  needs = D.packed_needs(rows, **kw)
  assert [2 * n for n in needs] == alone
  got = [b["inputs"].shape[0] for b in D.iterate(D.packed_batches(rows, action_len=3, **kw))]
  assert got == alone
  unpacked = [0] * len(needs)  # 0: the unpacked layout, as `batches` gives it
  for u, b in zip(D.iterate(D.packed_batches(rows, action_len=3, seqs_per_micro=unpacked,
                                             **kw)),
                  D.iterate(D.batches(rows, batch_size=8, seq_len=14, action_len=3, pad_id=0,
                                      seed=3, epochs=2)), strict=True):
    assert set(u) == set(D.BATCH_KEYS)
    for k in D.BATCH_KEYS:
      np.testing.assert_array_equal(u[k], b[k])
  more = [n + i % 3 for i, n in enumerate(needs)]
  got = [b["inputs"].shape[0]
         for b in D.iterate(D.packed_batches(rows, action_len=3, seqs_per_micro=more, **kw))]
  assert got == [2 * n for n in more]
  with pytest.raises(ValueError, match="sequences per micro-batch"):
    list(D.iterate(D.packed_batches(rows, action_len=3, seqs_per_micro=[1] * len(needs), **kw)))


def test_reuse_count_takes_the_smallest_compiled_count_within_the_slack():
  """A compiled count c serves a need n when n <= c <= 1.25 n; a need above 7/8 of the rows
  is laid out unpacked (0) and compiles no packed shape."""
  needs, rows = (40, 36, 32, 44, 33, 8, 7, 10, 9, 57, 64, 56), 64
  compiled = []
  picks = [D.reuse_count(n, compiled, rows) for n in needs]
  want, ref = [], []
  for n in needs:
    fits = [c for c in ref if n <= c <= 1.25 * n]
    want.append(0 if n > 56 else min(fits) if fits else n)
    if n <= 56 and not fits:
      ref.append(n)
  assert picks == want == [40, 40, 40, 44, 40, 8, 8, 10, 10, 0, 0, 56]
  assert compiled == ref == [40, 44, 8, 10, 56]


def test_round_up_count_against_a_loop():
  """The smallest count >= n among 1..8 and, per doubling above, 8 evenly spaced ones."""
  ladder = sorted({k for k in range(1, 9)} | {2 ** e + j * 2 ** e // 8 for e in range(3, 10)
                                               for j in range(1, 9)})
  for n in range(1, 600):
    want = min(k for k in ladder if k >= n)
    assert D.round_up_count(n) == want, n
    assert (want - n) / n < 1 / 8


def test_packed_sequence_count_is_a_multiple_of_the_data_axis():
  rows = _rows(np.random.default_rng(3), 12)
  for m, d in ((1, 4), (2, 4), (2, 3)):
    b = D.pack_rows(rows, seq_len=14, action_len=3, micro_batches=m, seq_multiple=d)
    assert b["inputs"].shape[0] % d == 0 and b["inputs"].shape[0] % m == 0


# ----------------------------------------------------------------------------------------
# A shared prefix (optim.share_prefix).


def _prefixed_rows(rng, n, head):
  """n rows whose prompts start with `head` then 1-4 ids of their own."""
  rows = _rows(rng, n, max_prompt=4)
  for r in rows:
    r["prompt_ids"] = list(head) + r["prompt_ids"]
  return rows


def test_common_prefix_len_leaves_each_row_a_prompt_token_and_ignores_empty_rows():
  row = lambda p, a=(9,): {"prompt_ids": list(p), "action_ids": list(a)}
  assert D.common_prefix_len([row([1, 2, 3, 4])]) == 3  # one row: all but its last
  assert D.common_prefix_len([row([1, 2, 3, 4])] * 3) == 3  # identical prompts
  assert D.common_prefix_len([row([1, 2, 3, 4]), row([1, 2, 5, 6, 7])]) == 2
  assert D.common_prefix_len([row([1, 2, 3, 4, 5]), row([1, 2, 3])]) == 2  # the shorter's cap
  assert D.common_prefix_len([row([1, 2, 3]), row([2, 2, 3])]) == 0  # nothing in common
  assert D.common_prefix_len([row([1]), row([1, 2])]) == 0
  # Rows without action tokens (padding rows) hold no tokens and do not count.
  assert D.common_prefix_len([row([1, 2, 3, 4]), D.empty_row(0), row([7, 7], ())]) == 3
  assert D.common_prefix_len([D.empty_row(0)] * 2) == D.common_prefix_len([]) == 0


def test_reuse_prefix_len_takes_the_longest_compiled_length_the_rows_hold():
  compiled = []
  picks = [D.reuse_prefix_len(n, compiled) for n in (21, 27, 21, 0, 15, 21, 30, 16)]
  assert picks == [21, 21, 21, 0, 15, 21, 21, 15]
  assert compiled == [21, 15]


@pytest.mark.parametrize("micro", [1, 2])
def test_a_prefixed_minibatch_holds_each_row_after_the_shared_prefix(micro):
  """An unpacked minibatch with prefix_len P: every row's prefix is the shared P ids, its
  inputs and mask what follows them in the unpacked row, act_pos pointing at the same
  tokens; the per-row arrays unchanged; a packed minibatch as without a prefix; the prefix
  counted once per micro-batch; a prefix the rows do not share refused."""
  rng = np.random.default_rng(6)
  head = [3, 4, 5, 6, 7]
  rows = _prefixed_rows(rng, 13, head)
  L, A, P = 12, 3, len(head)
  assert D.common_prefix_len(rows) == P
  kw = dict(batch_size=8, seq_len=L, pad_id=0, seed=1, epochs=2, micro_batches=micro)
  plain = list(D.iterate(D.batches(rows, action_len=A, **{k: v for k, v in kw.items()
                                                          if k != "micro_batches"})))
  unpacked = D.packed_batches(rows, action_len=A, seqs_per_micro=[0] * 4, prefix_len=P, **kw)
  for got, want in zip(D.iterate(unpacked), plain, strict=True):
    assert set(got) == set(D.PREFIXED_KEYS)
    np.testing.assert_array_equal(got["prefix"], np.tile(head, (8, 1)))
    np.testing.assert_array_equal(got["inputs"], want["inputs"][:, P:])
    np.testing.assert_array_equal(got["attn_mask"], want["attn_mask"][:, P:])
    for k in ("targets", "loss_mask", "old_logp", "adv"):
      np.testing.assert_array_equal(got[k], want[k])
    real = want["loss_mask"] > 0
    np.testing.assert_array_equal(got["act_pos"][real], want["act_pos"][real] - P)
    assert (got["act_pos"][~real] == 0).all()
    n_real = int(want["attn_mask"][want["loss_mask"].any(-1)].sum())  # rows' whole tokens
    n_rows = int(want["loss_mask"].any(-1).sum())
    assert D.token_counts(got, micro) == (n_real - (n_rows - micro) * P,
                                          8 * (L - P) + micro * P)
  packs = D.packed_needs(rows, **kw)
  with_prefix = D.packed_batches(rows, action_len=A, seqs_per_micro=packs, prefix_len=P, **kw)
  for got, want in zip(D.iterate(with_prefix),
                       D.iterate(D.packed_batches(rows, action_len=A, seqs_per_micro=packs,
                                                  **kw)), strict=True):
    assert set(got) == set(D.PACKED_KEYS)
    for k in D.PACKED_KEYS:
      np.testing.assert_array_equal(got[k], want[k])
  # Rows with nothing in common: prefix_len 0, the unpacked layout.
  other = rows + [D.sft_row([2, 3], [4])]
  assert D.common_prefix_len(other) == 0
  for got, want in zip(D.iterate(D.packed_batches(other, action_len=A, seqs_per_micro=[0] * 4,
                                                  prefix_len=0, **kw)),
                       D.iterate(D.batches(other, action_len=A, **{
                           k: v for k, v in kw.items() if k != "micro_batches"})), strict=True):
    assert set(got) == set(D.BATCH_KEYS)
    for k in D.BATCH_KEYS:
      np.testing.assert_array_equal(got[k], want[k])
  with pytest.raises(ValueError, match="same 6 prompt tokens"):
    D.packed_batches(rows + [D.sft_row(head + [1], [2])], action_len=A, prefix_len=6, **kw)
