"""llama.cpp's own tokenizer test vocabularies (`models/ggml-vocab-<name>.gguf` with `.gguf.inp` / `.gguf.out`),
taken from the llama.cpp source vendored in the llama-cpp-python sdist (tests and golden scripts only).

- `VOCABS`: the vocabularies of the families hitenter's tokenizers cover (byte-level BPE pre-tokenizers in
  bpe.PRE_TYPES, SentencePiece, WordPiece). Together they are ~45 MB, too big for the repository: they live in
  `vocab_dir()` (`hitenter_home()/llamacpp-vocab/<version>`), and the expected ids are committed as goldens
  (scripts/make_llamacpp_vocab_goldens.py). `WITHOUT_TEST_DATA` names those this release ships without
  `.inp` / `.out` (nomic-bert-moe, SentencePiece unigram): only the `.gguf` is taken, and their goldens
  tokenize the `.inp` texts of another vocabulary (`input_texts`).
- `ensure_vocabs(sdist=None)` puts them there: from a local sdist tarball when given, else from
  `pip download --no-deps --no-binary :all: llama-cpp-python==<version>` (the package registry, the only
  network hitenter uses). Raises RuntimeError with pip's message when that fails.
- `read_llamacpp_tests(name)`: the `.inp` texts and `.out` ids, split the way llama.cpp's test-tokenizer-0
  reads them (texts separated by "\\n__ggml_vocab_test__\\n", one line of ids per text).
- `input_texts(name)`: the test-tokenizer-0 texts for `name` (for `WITHOUT_TEST_DATA`, bert-bge's: the
  texts most `.inp` files of this release hold).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from hitenter.paths import hitenter_home

LLAMA_CPP_PYTHON = "0.3.36"
VOCABS = ("bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
          "llama-spm", "mpt", "nomic-bert-moe", "phi-3", "qwen2", "qwen35", "refact", "starcoder")
WITHOUT_TEST_DATA = frozenset({"nomic-bert-moe"})
_SEPARATOR = "\n__ggml_vocab_test__\n"
_SUFFIXES = (".gguf", ".gguf.inp", ".gguf.out")


def vocab_dir() -> Path:
    return hitenter_home() / "llamacpp-vocab" / LLAMA_CPP_PYTHON


def vocab_path(name: str) -> Path:
    return vocab_dir() / f"ggml-vocab-{name}.gguf"


def _suffixes(name: str) -> tuple[str, ...]:
    return _SUFFIXES[:1] if name in WITHOUT_TEST_DATA else _SUFFIXES


def _missing() -> list[str]:
    return [n for n in VOCABS if not all((vocab_dir() / f"ggml-vocab-{n}{s}").is_file() for s in _suffixes(n))]


def _extract(sdist: Path, names: list[str]) -> None:
    wanted = {f"ggml-vocab-{n}{s}" for n in names for s in _suffixes(n)}
    out = vocab_dir()
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and "/vendor/llama.cpp/models/" in member.name and base in wanted:
                src = tar.extractfile(member)
                assert src is not None
                tmp = out / f".{base}.partial"
                tmp.write_bytes(src.read())
                tmp.replace(out / base)


def ensure_vocabs(sdist: Path | None = None) -> Path:
    """Make every vocabulary in VOCABS present in `vocab_dir()` (see the module docstring); return the folder."""
    names = _missing()
    if not names:
        return vocab_dir()
    if sdist is not None:
        _extract(sdist, names)
    else:
        with tempfile.TemporaryDirectory(prefix="llamacpp-sdist-") as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                   f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp],
                                  capture_output=True, text=True, check=False)
            found = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            if proc.returncode != 0 or not found:
                raise RuntimeError(f"pip download of the llama-cpp-python sdist failed: {proc.stderr[-1500:]}")
            _extract(found[0], names)
    if _missing():
        raise RuntimeError(f"the sdist has no test vocabularies for {_missing()}")
    return vocab_dir()


def read_llamacpp_tests(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs of llama.cpp's test-tokenizer-0 data for vocabulary `name`, read as its
    read_tests() does."""
    base = vocab_path(name)
    raw = base.with_name(base.name + ".inp").read_bytes().decode("utf-8")
    lines = base.with_name(base.name + ".out").read_text(encoding="utf-8").split("\n")
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(_SEPARATOR, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(_SEPARATOR)
    ids = [[int(x) for x in line.split()] for line in lines[: len(texts)]]
    return list(zip(texts, ids, strict=True))


def input_texts(name: str) -> list[str]:
    """The test-tokenizer-0 input texts for vocabulary `name` (module doc)."""
    return [t for t, _ in read_llamacpp_tests("bert-bge" if name in WITHOUT_TEST_DATA else name)]
