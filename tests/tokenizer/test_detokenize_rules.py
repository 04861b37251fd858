"""Fast-lane checks of llama_detokenize's rules on small vocabularies (the real vocabularies are compared
with llama.cpp in test_llamacpp_vocabs.py / test_spm.py, slow): SentencePiece's leading space, BOS with
remove_special, clean_spaces per pre-tokenizer, user-defined tokens with parse_special=false."""

from __future__ import annotations

from typing import Any

from hitenter.testing.tiny_model import tiny_vocab
from hitenter.tokenizer import Tokenizer
from hitenter.tokenizer.bpe import clean_spaces


def _spm(add_space_prefix: bool) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "i", "hi", "▁hi", "\n\n"]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, 0.0],
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * 5 + [4],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_space_prefix": add_space_prefix}


def test_spm_decode_drops_the_space_the_encoder_added() -> None:
    tok = Tokenizer.from_gguf(_spm(True))
    ids = tok.encode("hi hi", add_bos=False)
    assert [tok.id_to_piece(i) for i in ids] == ["▁hi", "▁hi"]
    assert tok.decode(ids) == "hi hi"                                   # the first piece's space goes
    with_bos = tok.encode("hi hi")
    assert with_bos[0] == tok.bos_token_id
    assert tok.decode(with_bos, skip_special_tokens=True) == " hi hi"   # a removed BOS keeps it (llama.cpp)
    assert tok.decode(with_bos) == "<s> hi hi"
    assert Tokenizer.from_gguf(_spm(False)).decode(ids) == " hi hi"     # no prefix added: nothing dropped


def test_user_defined_tokens_split_without_parse_special() -> None:
    tok = Tokenizer.from_gguf(_spm(False))
    (nn,) = tok.encode("\n\n", add_bos=False)
    assert tok.encode("hi\n\nhi", add_bos=False, parse_special=False) == [tok.encode("hi", add_bos=False)[0], nn,
                                                                         tok.encode("hi", add_bos=False)[0]]
    assert tok.bos_token_id not in tok.encode("<s>", add_bos=False, parse_special=False)


def test_clean_spaces_by_pre_tokenizer() -> None:
    assert clean_spaces(b"a , b . c ' d it 's I 'm we 're 've 't 'll") == b"a, b. c'd it's I'm we're've 't 'll"
    tokens, types, merges = tiny_vocab()
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.merges": merges}
    text = "Hello , world ?"
    for pre, cleaned in (("gpt-2", True), ("llama-bpe", True), ("smollm", False), ("qwen2", False), ("gpt-4o", False)):
        tok = Tokenizer.from_gguf({**md, "tokenizer.ggml.pre": pre})
        assert tok.decode(tok.encode(text, add_bos=False)) == ("Hello, world?" if cleaned else text), pre
