"""lm-eval 0.4.13 ``local-completions`` end to end against ``hitenter``'s server: a tiny local
multiple-choice task (jsonl), the remote tokenizer (``/tokenizer_info``, ``/tokenize``), and a check that
every loglikelihood lm-eval reports equals the engine's own for the same tokens.

    python bench/lm_eval_check.py [--model smollm2-135m-instruct] [--lm-eval /work/venvs/lmeval/bin/lm_eval]

lm-eval lives in its own venv (it drags datasets/pandas/scikit-learn); this script only runs it.
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.server.prompt_logprobs import score_prompts
from hitenter.testing.live_server import live_server

DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " Tokyo"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven", " nine"], "answer": 0},
    {"question": "The sky on a clear day is", "choices": [" green", " blue", " red"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": [" Celsius", " Kelvin"], "answer": 0},
]
TASK = """task: hitenter_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def _pairs(arguments: object) -> list[tuple[str, str]]:
    """lm-eval's logged (context, continuation) pairs: a dict of {arg_0, arg_1} dicts, or a list of pairs."""
    items = list(arguments.values()) if isinstance(arguments, dict) else list(arguments)  # type: ignore[union-attr]
    return [(a["arg_0"], a["arg_1"]) if isinstance(a, dict) else (a[0], a[1]) for a in items]


def run(model: str | None, lm_eval: str) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="hitenter-lmeval-"))
    (tmp / "tiny.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp / "tiny_mc.yaml").write_text(TASK.format(data=tmp / "tiny.jsonl"))
    engine = LLMEngine(model, max_model_len=1024)
    with live_server(create_app(engine, served_model_name="m")) as srv:
        args = [lm_eval, "run", "--model", "local-completions", "--tasks", "hitenter_tiny_mc", "--include_path", str(tmp),
                "--model_args", f"model=m,base_url={srv.url}/v1/completions,tokenizer_backend=remote,"
                "tokenized_requests=True,num_concurrent=1,max_retries=1",
                "--log_samples", "--output_path", str(tmp / "out")]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:    # older CLIs have no `run` subcommand
            proc = subprocess.run([a for a in args if a != "run"], capture_output=True, text=True, timeout=1200)
        print(proc.stdout[-3000:])
        if proc.returncode != 0:
            print(proc.stderr[-5000:])
            return 1
    tok, worst, n = engine.tokenizer, 0.0, 0
    for path in glob.glob(str(tmp / "out" / "**" / "samples_*.jsonl"), recursive=True):
        for line in Path(path).read_text().splitlines():
            s = json.loads(line)
            for (ctx, cont), resp in zip(_pairs(s["arguments"]), s["resps"], strict=True):
                c, k = tok.encode(ctx), tok.encode(cont, add_bos=False)
                sc = score_prompts(engine, [c + k], 0)[0]
                own = sum(lp.logprob for lp in sc.logprobs[len(c):] if lp is not None)
                worst, n = max(worst, abs(own - float(resp[0][0]))), n + 1
    print(f"{n} loglikelihoods compared with the engine's own: max |diff| = {worst:.2e}")
    return 0 if n and worst < 1e-3 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--lm-eval", default="/work/venvs/lmeval/bin/lm_eval")
    a = ap.parse_args()
    sys.exit(run(a.model, a.lm_eval))
