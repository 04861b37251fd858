"""Tokenization: GGUF byte-level BPE (`Tokenizer`, llama.cpp-exact ids) and chat-template rendering."""

from hitenter.tokenizer.bpe import Tokenizer, read_tokenizer_metadata
from hitenter.tokenizer.chat_template import render_chat_template, validate_messages

__all__ = ["Tokenizer", "read_tokenizer_metadata", "render_chat_template", "validate_messages"]
