"""Tokenization: GGUF byte-level BPE (`Tokenizer`, llama.cpp-exact ids), SentencePiece-BPE (`SpmTokenizer`,
which `Tokenizer.from_gguf` builds for those vocabularies: importing spm.py registers it), Gemma 4's
SentencePiece-style BPE with merges (`Gemma4Tokenizer`, gemma4_bpe.py, registered the same way), WordPiece
(`WordPieceTokenizer`, BERT vocabularies: wordpiece.py), SentencePiece unigram (`UgmTokenizer`, "t5"
vocabularies: ugm.py) and chat-template rendering."""

from hitenter.tokenizer.bpe import Tokenizer, read_tokenizer_metadata
from hitenter.tokenizer.chat_template import render_chat_template, validate_messages
from hitenter.tokenizer.gemma4_bpe import Gemma4Tokenizer
from hitenter.tokenizer.spm import SpmTokenizer
from hitenter.tokenizer.ugm import UgmTokenizer
from hitenter.tokenizer.wordpiece import WordPieceTokenizer

__all__ = ["Gemma4Tokenizer", "SpmTokenizer", "Tokenizer", "UgmTokenizer", "WordPieceTokenizer", "read_tokenizer_metadata", "render_chat_template", "validate_messages"]
