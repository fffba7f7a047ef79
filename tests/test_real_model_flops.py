"""benchmarks/real_model.py's FLOP count of a LoRA step, against a count token by token:
with a shared prefix, the prefix once a micro-batch and each row's own tokens attending to
the prefix and to their own; without, every row's tokens."""

import types

import pytest

from benchmarks import real_model as rm

CFG = types.SimpleNamespace(num_layers=3, hidden_size=16, intermediate_size=40, num_heads=4,
                            num_kv_heads=2, head_dim=4, vocab_size=50,
                            lora=types.SimpleNamespace(rank=2, on=lambda name: name != "o_proj"))


def token_by_token(rows, kl, prefix_len, micro):
  base = 2 * CFG.num_layers * rm._linear_params(CFG)  # pylint: disable=protected-access
  adapters = 2 * CFG.num_layers * rm._lora_params(CFG)  # pylint: disable=protected-access
  fwd = 2 if kl else 1
  per_key = 4 * CFG.num_layers * CFG.num_heads * CFG.head_dim * (fwd + 2)
  per_token = base * (fwd + 1) + adapters * (fwd + 2)
  total = 0.0
  for _ in range(micro):  # the prefix: query q reads keys 0..q
    total += sum(per_token + per_key * (q + 1) for q in range(prefix_len))
  for r in rows:
    fed = len(r["prompt_ids"]) + len(r["action_ids"]) - 1
    total += sum(per_token + per_key * (q + 1) for q in range(prefix_len, fed))
    total += 2 * CFG.hidden_size * CFG.vocab_size * len(r["action_ids"]) * (fwd + 1)
  return total


@pytest.mark.parametrize("kl", [False, True])
@pytest.mark.parametrize("prefix_len,micro", [(0, 1), (3, 1), (3, 2), (5, 4)])
def test_update_flops_count_what_the_layout_computes(kl, prefix_len, micro):
  rows = [{"prompt_ids": list(range(n)), "action_ids": [1] * a}
          for n, a in ((7, 2), (9, 1), (6, 3), (8, 2))]
  got = rm.update_flops(CFG, rows, kl, prefix_len, micro)
  assert got == pytest.approx(token_by_token(rows, kl, prefix_len, micro), rel=1e-12)
  if prefix_len:  # less than the rows' whole work where a micro-batch holds several rows
    whole = rm.update_flops(CFG, rows, kl)
    assert got < whole if micro < len(rows) else got == whole
