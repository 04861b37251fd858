"""Write llama.cpp's pooled embeddings / rerank scores for the tiny embedding and reranking GGUFs of
hitenter/testing/tiny_encoders.py: tests/goldens/encoders/<family>.npz.

Each file is run by llama-cpp-python 0.3.36 (llama.cpp 0c1e570, CPU, F32 weights and KV cache) in embedding mode with the
file's own pooling (`Llama(path, embedding=True)`, pooling_type unspecified): every sequence decoded on its
own (memory cleared before each), `llama_get_embeddings_seq` read for `n` floats (n_embd, or the classifier's
n_cls_out for rank pooling), not normalized. The sequences are random token ids (seeded) of lengths
LENGTHS; llama.cpp's tokens of its rerank prompts for the (QUERY, doc) pairs of tiny_encoders (server-common.cpp
format_prompt_rerank: the file's `rerank` chat template with {query} / {document} replaced, tokenized with
special tokens parsed and none added; else BOS, query, EOS where add_eos, SEP where add_sep, document, EOS
where add_eos) and their pooled outputs; for the WordPiece and unigram families, llama.cpp's tokenization of
tiny_encoders.TEXTS (add_special=true, parse_special=false).

npz keys: seed, gguf_sha256, ids (flat int32), lengths, pooled [len(lengths), n], rerank_ids /
rerank_lengths / rerank_pooled (per DOCS), and for WordPiece / unigram files text_ids / text_lengths (per TEXTS).

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_encoder_goldens.py --llama-python /work/venvs/llamacpp/bin/python [family ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (1, 2, 7, 16, 33, 60)


# ---- worker: runs inside the llama-cpp-python venv -----------------------------------------------------


def _worker(path: str, seqs: list[list[int]], texts: list[str], query: str, docs: list[str]) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(path, embedding=True, n_ctx=2048, n_batch=2048, n_ubatch=2048, n_threads=2,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    rank = llm.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_RANK
    n = llama_cpp.llama_model_n_cls_out(llm.model) if rank else llm.n_embd()
    pooled = []
    for s in seqs:
        llm._batch.reset()
        llm._batch.add_sequence(s, 0, True)
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
        pooled.append([float(ptr[i]) for i in range(n)])
    out = {"pooled": pooled}
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    if llama_cpp.llama_vocab_type(vocab) in (llama_cpp.LLAMA_VOCAB_TYPE_WPM, llama_cpp.LLAMA_VOCAB_TYPE_UGM):
        out["text_ids"] = [llm.tokenize(t.encode(), add_bos=True, special=False) for t in texts]
    template = llama_cpp.llama_model_chat_template(llm.model, b"rerank")
    rerank = []
    for d in docs:
        if template:
            prompt = template.decode().replace("{query}", query).replace("{document}", d)
            rerank.append(llm.tokenize(prompt.encode(), add_bos=False, special=True))
            continue
        bos, sep, eos = (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_sep(vocab),
                         llama_cpp.llama_vocab_eos(vocab))
        eos = eos if eos != -1 else sep
        add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
        ids = ([bos] if llama_cpp.llama_vocab_get_add_bos(vocab) else [])
        ids += llm.tokenize(query.encode(), add_bos=False, special=False) + ([eos] if add_eos else [])
        ids += [sep] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        ids += llm.tokenize(d.encode(), add_bos=False, special=False) + ([eos] if add_eos else [])
        rerank.append(ids)
    out["rerank_ids"] = rerank
    out["rerank_pooled"] = []
    for s in rerank:
        llm._batch.reset()
        llm._batch.add_sequence(s, 0, True)
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
        out["rerank_pooled"].append([float(ptr[i]) for i in range(n)])
    return out


# ---- driver: the project venv ----------------------------------------------------------------------


def _sequences(vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in LENGTHS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    import numpy as np

    from hitenter.models.gguf import open_gguf, read_gguf_metadata
    from hitenter.testing.paths import GOLDENS
    from hitenter.testing.tiny_encoders import DOCS, ENCODERS, QUERY, TEXTS, write_tiny_encoder

    out_dir = GOLDENS / "encoders"
    out_dir.mkdir(parents=True, exist_ok=True)
    seed = 0
    for fam in args.families or ENCODERS:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_tiny_encoder(Path(tmp) / f"{fam}.gguf", fam, seed=seed)
            vocab = len(read_gguf_metadata(open_gguf(path))["tokenizer.ggml.tokens"])
            seqs = _sequences(vocab, seed)
            job = {"path": str(path), "seqs": seqs, "texts": TEXTS, "query": QUERY, "docs": DOCS}
            proc = subprocess.run([args.llama_python, __file__, "--llama-python", "-", "--worker", json.dumps(job)],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"{fam}: llama.cpp worker failed:\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            data = {"seed": seed, "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "ids": np.array([t for s in seqs for t in s], np.int32), "lengths": np.array(LENGTHS, np.int32),
                    "pooled": np.array(res["pooled"], np.float32)}
            for key in ("text_ids", "rerank_ids"):
                if key in res:
                    data[key] = np.array([t for s in res[key] for t in s], np.int32)
                    data[key.replace("_ids", "_lengths")] = np.array([len(s) for s in res[key]], np.int32)
            data["rerank_pooled"] = np.array(res["rerank_pooled"], np.float32)
            np.savez(out_dir / f"{fam}.npz", **data)
            print(f"{fam}: pooled {data['pooled'].shape}")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        job = json.loads(sys.argv[sys.argv.index("--worker") + 1])
        print(json.dumps(_worker(job["path"], job["seqs"], job["texts"], job["query"], job["docs"])))
    else:
        main()
