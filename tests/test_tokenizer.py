"""The byte-level BPE round-trips any text, special-token spellings included, and survives
save/load."""

from hypothesis import given, settings, strategies as st

from csa_jax.model.tokenizer import Tokenizer, train_bpe

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


# Spellings of the special tokens and their pieces, mixed into arbitrary text.
SPECIAL_SPELLINGS = ["<eos>", "<pad>", "<eos", "eos>", "<", ">", "<<eos>>", "<pad><eos>"]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(SPECIAL_SPELLINGS)),
                max_size=8).map("".join))
def test_roundtrip_text_with_special_spellings(text):
  # Text is text: a special token's spelling in it is encoded as ordinary bytes, never as
  # the control token (an observation cannot end the action), and decodes back unchanged.
  ids = _TOK.encode(text)
  assert _TOK.decode(ids) == text
  assert _TOK.eos_id not in ids and _TOK.pad_id not in ids
  assert _TOK.encode_batch([text, "x"])[0] == ids


def test_special_spellings_match_only_when_asked():
  assert _TOK.decode(_TOK.encode("a<eos>b")) == "a<eos>b"
  # Chat-template markup asks for its special tokens; they decode to nothing, as the
  # end-of-action token the policy writes does.
  assert _TOK.encode("a<eos>b", specials=True) == _TOK.encode("a") + [_TOK.eos_id] + _TOK.encode("b")
  assert _TOK.decode(_TOK.encode("a<eos>b", specials=True)) == "ab"


def test_save_load(tmp_path):
  tok = train_bpe(CORPUS, 300)
  tok.save(str(tmp_path))
  back = Tokenizer.load(str(tmp_path))
  s = "To the North you see the pantry. ünseen wörds 42"
  assert back.encode(s) == tok.encode(s) and back.eos_id == tok.eos_id
