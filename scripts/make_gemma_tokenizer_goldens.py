"""Write tests/goldens/tokenizer_gemma3.json: llama.cpp's token ids for Gemma 3's SentencePiece vocabulary.

Reference: llama.cpp through llama-cpp-python 0.3.36 in its own venv (see make_tokenizer_goldens.py for the
set-up), `Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)`, plus the
vocabulary facts (BOS/EOS/EOG/add_bos, control tokens, every token's bytes) the smollm2/qwen goldens have.
Inputs: tests/data/tokenizer_corpus.json plus EXTRA below (whitespace runs, digits, emoji, CJK, byte
fallback, Gemma's control / user-defined tokens).

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_gemma_tokenizer_goldens.py --llama-python /work/venvs/llamacpp/bin/python
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from make_tokenizer_goldens import llama_reference  # noqa: E402

NAME = "gemma-3-270m"
EXTRA = [
    " ", "  ", "   ", "    x", "a  b   c    d", "\t", "\t\t x", "\n", "\n\n", " \n \n", "end   ", "x\u3000y",
    "0", "12", "123", "1234567890", "3.14159", "-42", "1,000,000", "٣٤٥", "²³",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "I ❤️ NY",
    "中文分词测试", "東京は日本の首都です。", "한국어 텍스트", "ひらがなカタカナ",
    "\ue000\ue001", "𓀀𓁹", "𠜎𠜱", "\x00\x01\x7f", "\u200b\u200d", "ǅ", "▁literal▁space", "a\u2581b",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos>", "<pad><unk><mask>",
    "<table><tr><td>x</td></tr></table>", "[multimodal]", "<start_of_image>", "<unused0><unused6241>",
    "<start_of_turn", "end_of_turn>", "<<bos>>",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    args = ap.parse_args()
    from hitenter.paths import hitenter_home

    path = hitenter_home() / "models" / f"{NAME}.gguf"
    if not path.is_file():
        sys.exit(f"{path} not present (hitenter pull {NAME})")
    corpus = json.loads((ROOT / "tests/data/tokenizer_corpus.json").read_text())
    texts = corpus + EXTRA
    ref = llama_reference(args.llama_python, path, texts)
    ids = ref.pop("ids")
    golden = {"model": NAME, "generated_by": "scripts/make_gemma_tokenizer_goldens.py", **ref,
              "tokenize": [{"text": t, "ids": i} for t, i in zip(texts, ids, strict=True)]}
    out = ROOT / "tests/goldens/tokenizer_gemma3.json"
    out.write_text(json.dumps(golden, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({len(texts)} strings, llama-cpp-python {ref['llama_cpp_python']})")


if __name__ == "__main__":
    main()
