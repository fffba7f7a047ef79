"""The byte-level BPE round-trips any text and survives save/load."""

from hypothesis import given, settings, strategies as st

from csa_jax.tokenizer import Tokenizer, train_bpe

CORPUS = ["You are in the kitchen. To the North you see the pantry.", " move north",
          " take coin", "Your task is to search the environment and find the coin."] * 20


def test_special_ids_and_size():
  tok = train_bpe(CORPUS, 300)
  assert {tok.pad_id, tok.eos_id} == {0, 1}
  assert tok.vocab_size <= 300
  assert tok.decode([tok.eos_id]) == ""


_TOK = train_bpe(CORPUS, 300)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_roundtrip_any_text(text):
  assert _TOK.decode(_TOK.encode(text)) == text


def test_save_load(tmp_path):
  tok = train_bpe(CORPUS, 300)
  tok.save(str(tmp_path))
  back = Tokenizer.load(str(tmp_path))
  s = "To the North you see the pantry. ünseen wörds 42"
  assert back.encode(s) == tok.encode(s) and back.eos_id == tok.eos_id
