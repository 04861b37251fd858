"""Tokenization: GGUF byte-level BPE (`Tokenizer`, llama.cpp-exact ids), SentencePiece-BPE (`SpmTokenizer`,
which `Tokenizer.from_gguf` builds for those vocabularies: importing spm.py registers it) and chat-template
rendering."""

from hitenter.tokenizer.bpe import Tokenizer, read_tokenizer_metadata
from hitenter.tokenizer.chat_template import render_chat_template, validate_messages
from hitenter.tokenizer.spm import SpmTokenizer

__all__ = ["SpmTokenizer", "Tokenizer", "read_tokenizer_metadata", "render_chat_template", "validate_messages"]
