"""CPU cost of the grammar mask per token at the sampler (no model): one row, temperature 0.7, a JSON
schema, on SmolLM2's 49k and Qwen2.5's 152k vocabularies. Process CPU time, so it holds on a shared box.

    python bench/structured_mask_cost.py
"""

import json
import os
import statistics
import time

import torch

from hitenter.engine.sampler import Sampler, SamplingMetadata, make_generator
from hitenter.engine.structured import backend_for
from hitenter.sampling_params import SamplingParams, StructuredSpec
from hitenter.tokenizer.bpe import Tokenizer

torch.set_num_threads(1)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}, "required": ["name", "age", "tags"], "additionalProperties": False}
text = '{"name": "Bob the sailor", "age": 42, "tags": ["a", "b", "a"]}'
for m in ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]:
    tok = Tokenizer.from_gguf(os.path.expanduser(f"~/.cache/hitenter/models/{m}.gguf"))
    V = tok.vocab_size
    be = backend_for(tok, V)
    ids = tok.encode(text, add_bos=False)
    s = Sampler()
    p = SamplingParams(temperature=0.7, seed=1)
    pg = p.replace(structured=StructuredSpec("json_schema", json.dumps(SCHEMA)))
    res = {}
    for label, params in (("plain", p), ("constrained", pg)):
        ts = []
        for _ in range(3):
            c = be.constraint(pg.structured) if params.structured else None
            for t in ids:
                logits = torch.randn(1, V)
                meta = SamplingMetadata([params], [make_generator(1)], constraints=[c])
                a = time.process_time()
                s(logits, meta)
                ts.append(time.process_time() - a)
                if c:
                    c.accept(t)
        res[label] = statistics.mean(ts)
    print(f"{m} V={V}: sampler step plain {res['plain']*1e3:.3f} ms, constrained {res['constrained']*1e3:.3f} ms CPU, "
          f"mask adds {(res['constrained']-res['plain'])*1e3:.3f} ms/token")
