"""Write Gemma 3 model goldens from HF transformers for tests/models/families/test_gemma3.py.

Reference: `AutoModelForCausalLM.from_pretrained(dir, gguf_file="gemma-3-270m.gguf", dtype=torch.float32)`
(transformers >= 5: Gemma3ForCausalLM, the GGUF dequantized by gguf-py, norm weights shifted back by -1),
eager attention so the sliding-window mask is HF's own. Prompt ids come from hitenter's tokenizer (checked
against llama.cpp by tests/tokenizer/test_spm.py) and are stored, so the tests need neither.

tests/goldens/model_gemma3_logits.json: per prompt (one longer than the 512-token sliding window, so the
  local layers' masking matters): ids, argmax and the max logit at every position, top-50 of the last row.
tests/goldens/model_gemma3_greedy.json: >= 6 prompts, 48 greedy ids each (EOS not special-cased), margins.
With --compare it also loads hitenter's model and prints the full-vocabulary max |logit difference|.

Regenerate (a few minutes on 2 cores): .venv/bin/python scripts/make_gemma3_goldens.py [--compare]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from make_model_goldens import GOLDENS, MODELS, NEW_TOKENS, TOP_K, greedy_set, write  # noqa: E402

NAME = "gemma-3-270m.gguf"
LONG = ("The history of the city is long and varied. " * 8 + "In the early days, merchants came from far away "
        "to trade spices, cloth and silver. Over the centuries the harbour grew, new walls were built, and the "
        "population rose and fell with wars, plagues and famines. ") * 6 + "Today, the city is best known for"
LOGIT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                 LONG]
GREEDY_PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def add(a, b):\n",
    "The three primary colors are",
    "In 1969, the first humans landed on",
    "A list of fruits: apple, banana,",
    "東京は日本の",
]


def load_hf() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(MODELS), gguf_file=NAME, dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


def hitenter_logits(ids: list[int]) -> torch.Tensor:
    """Logits of every position from hitenter's model (one prefill; for --compare)."""
    from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
    from hitenter.models.loader import load_model

    global _OURS
    if "_OURS" not in globals():
        _OURS = load_model(MODELS / NAME)
    model, cfg = _OURS
    bs, n = 16, len(ids)
    nb = -(-n // bs)
    meta = AttentionMetadata([0, n], [n], [list(range(nb))], torch.arange(n), bs)
    hidden = model(torch.tensor(ids), torch.arange(n), meta, allocate_kv_caches(cfg, nb, bs))
    return model.compute_logits(hidden)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", action="store_true", help="also print hitenter's max logit difference")
    args = ap.parse_args()
    from hitenter.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(MODELS / NAME)
    model = load_hf()
    cases = []
    for text in LOGIT_PROMPTS:
        ids = tok.encode(text)
        logits = model(torch.tensor([ids])).logits[0].float()
        top = torch.topk(logits[-1], TOP_K)
        cases.append({"text": text, "ids": ids, "argmax": logits.argmax(-1).tolist(),
                      "max": logits.max(-1).values.tolist(),
                      "last_top_ids": top.indices.tolist(), "last_top_values": top.values.tolist()})
        if args.compare:
            ours = hitenter_logits(ids)
            agree = int((ours.argmax(-1) == logits.argmax(-1)).sum())
            print(f"  {len(ids)} tokens: argmax agree {agree}/{len(ids)}, "
                  f"max |diff| {float((ours - logits).abs().max()):.3e}")
    write("model_gemma3_logits.json", {"model": NAME, "cases": cases})
    prompts = [("raw", t, tok.encode(t)) for t in GREEDY_PROMPTS]
    write("model_gemma3_greedy.json", {"model": NAME, "new_tokens": NEW_TOKENS, "cases": greedy_set(model, prompts)})
    print(f"goldens in {GOLDENS}")


if __name__ == "__main__":
    main()
