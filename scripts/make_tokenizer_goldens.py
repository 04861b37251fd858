"""Write tokenizer and chat-template goldens from independent references.

References (neither is a hitenter dependency):
- token ids, vocab facts (BOS/EOS/EOG/add_bos, control tokens, every token's bytes): llama.cpp through
  llama-cpp-python 0.3.36 in its own venv:
      python3 -m venv /work/venvs/llamacpp
      CMAKE_BUILD_PARALLEL_LEVEL=2 /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36
  It is called as `Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)`.
- chat-template text: transformers' `apply_chat_template(..., tokenize=False)` (the project venv, extra
  `golden`); the ids of that text come from llama.cpp as above.

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_tokenizer_goldens.py --llama-python /work/venvs/llamacpp/bin/python
It writes tests/goldens/tokenizer_<model>.json for every model in MODELS whose GGUF is in
`hitenter_home()/models` (others are skipped with a note). Inputs: tests/data/tokenizer_corpus.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"smollm2": "smollm2-135m-instruct", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct"}
CONVERSATIONS: list[tuple[list[dict[str, str]], bool]] = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "user", "content": "Hello!"}], False),
    ([{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Leaves fall\nsoftly."},
      {"role": "user", "content": "Another one, about code:"}], True),
    ([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "def f(x):\n\treturn x"}],
     False),
    ([{"role": "user", "content": "  spaces, tabs\t, 数字 123456 and 👨‍👩‍👧‍👦  "}], True),
]
ATTR_UNKNOWN, ATTR_CONTROL = 1 << 0, 1 << 3

# ---- worker: runs inside the llama-cpp-python venv -----------------------------------------------------


def _piece(llama_cpp: object, vocab: object, tid: int) -> bytes:
    import ctypes

    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, tid, buf, 256, 0, True)  # type: ignore[attr-defined]
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, tid, buf, -n, 0, True)  # type: ignore[attr-defined]
    return buf.raw[:n]


def worker() -> None:
    """stdin: {"model": path, "texts": [...]}; stdout: ids per text and vocab facts from llama.cpp."""
    import llama_cpp

    req = json.load(sys.stdin)
    llm = llama_cpp.Llama(model_path=req["model"], vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    h = hashlib.sha256()
    for i in range(n):
        p = _piece(llama_cpp, vocab, i)
        h.update(len(p).to_bytes(4, "little") + p)
    out = {
        "llama_cpp_python": llama_cpp.__version__,
        "n_vocab": n,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "special": [i for i in range(n) if llama_cpp.llama_vocab_get_attr(vocab, i) & (ATTR_CONTROL | ATTR_UNKNOWN)],
        "token_bytes_sha256": h.hexdigest(),
        "token_bytes_head": [_piece(llama_cpp, vocab, i).hex() for i in range(min(n, 400))],
        "ids": [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in req["texts"]],
    }
    json.dump(out, sys.stdout)


# ---- driver: runs in the project venv -------------------------------------------------------------------


def llama_reference(llama_python: str, model: Path, texts: list[str]) -> dict:
    proc = subprocess.run([llama_python, __file__, "--worker"], input=json.dumps({"model": str(model), "texts": texts}),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"llama.cpp worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def render_with_transformers(model: Path, template: str, bos: str, eos: str) -> list[str]:
    """Chat texts rendered by transformers' own apply_chat_template (vocab-independent)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token=bos, eos_token=eos)
    tok.chat_template = template
    return [tok.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False) for msgs, gen in CONVERSATIONS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    args = ap.parse_args()
    if args.worker:
        return worker()
    sys.path.insert(0, str(ROOT))
    from hitenter.paths import hitenter_home
    from hitenter.tokenizer.bpe import read_tokenizer_metadata

    corpus = json.loads((ROOT / "tests/data/tokenizer_corpus.json").read_text())
    for short, name in MODELS.items():
        path = hitenter_home() / "models" / f"{name}.gguf"
        if not path.is_file():
            print(f"skip {name}: {path} not present")
            continue
        md = read_tokenizer_metadata(path)
        toks = md["tokenizer.ggml.tokens"]
        bos = toks[md["tokenizer.ggml.bos_token_id"]] if "tokenizer.ggml.bos_token_id" in md else ""
        eos = toks[md["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in md else ""
        chats = render_with_transformers(path, md["tokenizer.chat_template"], bos, eos)
        ref = llama_reference(args.llama_python, path, corpus + chats)
        ids = ref.pop("ids")
        golden = {
            "model": name,
            "generated_by": "scripts/make_tokenizer_goldens.py",
            **ref,
            "tokenize": [{"text": t, "ids": i} for t, i in zip(corpus, ids, strict=False)],
            "chat": [{"messages": m, "add_generation_prompt": g, "text": t, "ids": i}
                     for (m, g), t, i in zip(CONVERSATIONS, chats, ids[len(corpus):], strict=True)],
        }
        out = ROOT / "tests/goldens" / f"tokenizer_{short}.json"
        out.write_text(json.dumps(golden, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {out} ({len(corpus)} strings, {len(chats)} chats, llama-cpp-python {ref['llama_cpp_python']})")


if __name__ == "__main__":
    main()
