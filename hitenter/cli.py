"""hitenter run | chat | serve | pull | models | plan | tokenize"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig option (hitenter/config.py: the fields, their help and choices)."""
    from hitenter.config import option_fields

    for _, f in option_fields():
        meta = f.metadata
        if meta.get("cli") is False:
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        default = f.default
        if f.type == "bool":     # a switch that turns the default off
            p.add_argument(flag, dest=f.name, action="store_false" if default else "store_true", default=default,
                           help=f"turn off: {meta['help']}" if default else meta["help"])
            continue
        typ = int if f.type.startswith("int") else str
        names = [flag, "-m"] if f.name == "model" else [flag]
        p.add_argument(*names, dest=f.name, type=typ, default=None, choices=meta.get("choices"),
                       help=meta["help"] + (f" (default {default})" if default is not None else ""))


def _engine_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """The engine options the flags set (model excluded), validated: a bad value fails here."""
    from hitenter.config import EngineConfig, option_fields

    kw = {f.name: getattr(a, f.name) for _, f in option_fields()
          if f.name != "model" and f.metadata.get("cli") is not False and hasattr(a, f.name)}
    kw = {k: v for k, v in kw.items() if v is not None}
    EngineConfig.from_options(a.model, **kw)
    return kw


def _engine_options_given(a: argparse.Namespace) -> list[str]:
    """The engine options (other than the model) set to something else than their default."""
    from hitenter.config import option_fields

    return [f.name for _, f in option_fields() if f.name != "model" and f.metadata.get("cli") is not False
            and getattr(a, f.name, None) not in (None, f.default)]


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def _server_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-server", action="store_true",
                   help="run the model in this process even when a hitenter server runs at $HITENTER_HOST "
                        "(default 127.0.0.1:8000; it is used when no engine option beyond --model is given)")


def _params(a: argparse.Namespace):  # type: ignore[no-untyped-def]
    from hitenter.sampling_params import SamplingParams

    return SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                          min_p=a.min_p, seed=a.seed, stop=a.stop)


def _report(n: int, t0: float, first: float | None, t1: float, finish_reason: str | None, via: str = "") -> None:
    ttft = (first - t0) if first is not None else float("nan")
    rate = (n - 1) / (t1 - first) if first is not None and n > 1 and t1 > first else float("nan")
    print(f"[{n} tokens, time to first token {ttft * 1000:.0f} ms, {rate:.1f} tokens/s, "
          f"finish_reason={finish_reason}{via}]", file=sys.stderr)


def _stream(llm, prompt: str, params) -> str:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    first: list[float] = []
    n = [0]

    def on_output(out) -> None:  # type: ignore[no-untyped-def]
        c = out.outputs[0]
        if c.delta_token_ids and not first:
            first.append(time.perf_counter())
        n[0] += len(c.delta_token_ids)
        if c.delta_text:
            sys.stdout.write(c.delta_text)
            sys.stdout.flush()

    out = llm.generate([prompt], params, on_output=on_output)[0]
    t1 = time.perf_counter()
    sys.stdout.write("\n")
    _report(n[0], t0, first[0] if first else None, t1, out.finish_reason)
    return out.text


def _server_for(a: argparse.Namespace) -> Any:
    """The running server to talk to (hitenter/remote.py), or None: run in this process. A server is
    used only when no engine option beyond --model is given (the server's own apply) and not
    --no-server."""
    if a.no_server or _engine_options_given(a):
        return None
    from hitenter import remote

    server = remote.server_address()
    return server if remote.running(server) else None


def _remote_stream(a: argparse.Namespace, server: Any, messages: list[dict[str, str]] | None,
                   prompt: str | None = None) -> str:
    """One reply streamed from ``server`` (remote.Unavailable before any text when it cannot serve it)."""
    from hitenter import remote

    sampling = remote.sampling_body(a.max_tokens, a.temperature, a.top_p, a.top_k, a.min_p, a.seed, a.stop)
    t0 = time.perf_counter()
    gen = remote.generate(server, remote.model_ref(a.model), sampling, messages=messages, prompt=prompt)
    pieces: list[str] = []
    while True:
        try:
            piece = next(gen)
        except StopIteration as stop:
            finish = stop.value
            break
        sys.stdout.write(piece)
        sys.stdout.flush()
        pieces.append(piece)
    sys.stdout.write("\n")
    first = t0 + finish.ttft if finish.ttft is not None else None
    _report(finish.tokens, t0, first, time.perf_counter(), finish.finish_reason,
            f", via the server at {server.host}:{server.port}")
    return "".join(pieces)


def _fallback(server: Any, e: Exception) -> None:
    print(f"hitenter: {e}; running the model in this process", file=sys.stderr)


def cmd_run(a: argparse.Namespace) -> int:
    server = _server_for(a)
    if server is not None:
        from hitenter.remote import RemoteError, Unavailable

        messages = None if a.raw else [{"role": "user", "content": a.prompt}]
        try:
            _remote_stream(a, server, messages, a.prompt if a.raw else None)
            return 0
        except Unavailable as e:
            _fallback(server, e)
        except RemoteError as e:
            raise ValueError(str(e)) from None
    from hitenter.import_gc import collector_paused

    with collector_paused("hitenter.llm"):
        from hitenter.llm import LLM

    llm = LLM(a.model, **_run_kwargs(a))
    prompt = a.prompt if a.raw else llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": a.prompt}], add_generation_prompt=True)
    _stream(llm, prompt, _params(a))
    return 0


def _run_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """Engine options for one conversation in this process: one sequence at a time unless asked (the KV
    budget then holds its windows, not 64 streams' worth)."""
    kw = _engine_kwargs(a)
    kw.setdefault("max_num_seqs", 1)
    return kw


def cmd_chat(a: argparse.Namespace) -> int:
    from hitenter.remote import RemoteError, Unavailable

    server = _server_for(a)
    llm = None
    messages: list[dict[str, str]] = []
    print("chat with the model; an empty line or Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        if server is not None:
            try:
                messages.append({"role": "assistant", "content": _remote_stream(a, server, messages)})
                continue
            except Unavailable as e:
                _fallback(server, e)
                server = None
            except RemoteError as e:
                raise ValueError(str(e)) from None
        if llm is None:
            from hitenter.import_gc import collector_paused

            with collector_paused("hitenter.llm"):
                from hitenter.llm import LLM

            llm = LLM(a.model, **_run_kwargs(a))
        prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        messages.append({"role": "assistant", "content": _stream(llm, prompt, _params(a))})
    return 0


def _reasoning_budget(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -2
    if n < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (unbounded) or an integer >= 0, got {text!r}")
    return n


def cmd_serve(a: argparse.Namespace) -> int:
    limits, lifecycle, engine_kwargs = _limits(a), _lifecycle(a), _engine_kwargs(a)   # bad values: before loading
    from hitenter.server.api import serve

    extra = ["trigram"] if a.extra_model is None else [m for m in a.extra_model if m != "none"]
    serve(model=a.model, host=a.host, port=a.port, api_key=a.api_key, served_model_name=a.served_model_name,
          max_queued_requests=a.max_queued_requests, extra_models=extra, max_body_bytes=a.max_body_bytes,
          header_timeout=a.header_timeout, metrics_public=a.metrics_public,
          allow_special_tokens_in_content=a.allow_special_tokens_in_content, allowed_origins=a.allowed_origins,
          limits=limits, lifecycle=lifecycle, reasoning_budget=a.reasoning_budget, **engine_kwargs)
    return 0


def _lifecycle(a: argparse.Namespace) -> object:
    from hitenter.server.keep_alive import parse_keep_alive
    from hitenter.server.lifecycle import Lifecycle

    try:
        keep = parse_keep_alive(a.keep_alive, bare_seconds=True)
    except ValueError as e:
        raise ValueError(f"--keep-alive: {e}") from e
    return Lifecycle(keep_alive=keep, max_loaded_models=a.max_loaded_models, max_loaded_memory=a.max_loaded_memory)


def _limits(a: argparse.Namespace) -> object:
    from dataclasses import fields

    from hitenter.server.body_limits import Limits
    return Limits(**{f.name: getattr(a, f.name) for f in fields(Limits)})


_LIMIT_HELP = {
    "max_json_depth": "deepest nesting of a field's value (schemas, tool arguments, messages)",
    "max_schema_nodes": "most JSON values in one JSON schema (413 above)",
    "max_enum_values": "largest enum of a schema (all its enums together: 4x) (413 above)",
    "max_pattern_chars": "longest regex: a schema's pattern or format, guided_regex (413 above)",
    "max_grammar_chars": "longest EBNF grammar (guided_grammar) (413 above)",
    "max_guided_choices": "most guided_choice entries (413 above)",
    "max_guided_choice_chars": "total length of the guided_choice entries, longest schema string (413 above)",
    "max_stop": "most stop strings", "max_logit_bias": "most logit_bias entries",
    "max_tools": "most tool definitions", "max_messages": "most messages or input items",
    "max_grammar_compile_seconds": "time limit of one grammar compilation (then 400; it runs off the engine "
                                   "thread and a spec that ran out is refused at once after)",
    "max_grammar_cache_bytes": "bytes of compiled grammars kept in the cache (least recently used out)",
}


def _server_guard_flags(p: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from hitenter.server.body_limits import Limits
    for f in fields(Limits):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"{_LIMIT_HELP[f.name]} (default {f.default})")
    p.add_argument("--max-body-bytes", type=int, default=32 << 20,
                   help="largest request body accepted; larger ones get 413 before parsing (default 32 MiB: "
                        "room for a base64 image of up to 20 MiB)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has to send a request's headers before 408 and close (default 10)")
    p.add_argument("--metrics-public", action="store_true",
                   help="serve /metrics without the --api-key (default: behind it)")
    p.add_argument("--reasoning-budget", type=_reasoning_budget, default=-1, metavar="N",
                   help="thinking tokens a reply may take before the model's end tag is written for it, when the "
                        "request gives no budget (Anthropic budget_tokens, vLLM's thinking_token_budget); "
                        "-1 unbounded (default), 0 closes the thinking section as it opens")
    p.add_argument("--allow-special-tokens-in-content", action="store_true",
                   help="trusted callers only: special-token text in chat messages becomes control tokens")
    p.add_argument("--allowed-origins", action="append", default=None, metavar="ORIGIN",
                   help="browser origins allowed cross-origin calls (CORS), e.g. http://localhost:3000 or '*' "
                        "(repeatable or comma-separated; default none: pages on other origins cannot call the API)")


def cmd_pull(a: argparse.Namespace) -> int:
    from hitenter.models.registry import DEFAULT_MODEL, pull

    path = pull(a.name or DEFAULT_MODEL, progress=lambda msg: print(msg, file=sys.stderr))
    print(path)
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from hitenter.models.registry import DEFAULT_MODEL, KNOWN_MODELS
    from hitenter.paths import hitenter_home

    for m in KNOWN_MODELS.values():
        path = hitenter_home() / "models" / f"{m.name}.gguf"
        flags = ("default " if m.name == DEFAULT_MODEL else "") + ("pulled" if path.exists() else "not pulled")
        flags += "" if m.supported else ", not yet supported"
        print(f"{m.name:32s} {flags:28s} {m.description}")
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    """Load the model as `run` would and print the kernel plan (hitenter/models/plan.py)."""
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.engine_options import engine_config

    eng = LLMEngine(config=engine_config(a.model, None, _engine_kwargs(a)))
    print(eng.plan.describe() if eng.plan is not None else "no plan")
    close = getattr(eng.runner, "close", None)
    if close is not None:
        close()
    return 0


def cmd_tokenize(a: argparse.Namespace) -> int:
    from hitenter.models.registry import resolve_model
    from hitenter.tokenizer.bpe import Tokenizer

    tok = Tokenizer.from_gguf(resolve_model(a.model))
    ids = tok.encode(a.text)
    pieces = [tok.id_to_piece(i) for i in ids]
    if a.json:
        print(json.dumps({"ids": ids, "pieces": pieces, "count": len(ids)}, ensure_ascii=False))
    else:
        for i, p in zip(ids, pieces, strict=True):
            print(f"{i:>7}  {p!r}")
        print(f"{len(ids)} tokens", file=sys.stderr)
    return 0


def cmd_envs(a: argparse.Namespace) -> int:
    from hitenter import envs

    last = None
    for group, name, default, value, effect in envs.describe():
        if group != last:
            print(("\n" if last else "") + f"{group}:")
            last = group
        print(f"  {name}={value or default}{'' if value else ' (default)'}\n      {effect}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hitenter", description="What happens when you hit Enter: an LLM engine you can watch.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="generate from one prompt, streaming")
    p.add_argument("prompt")
    p.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    _add_engine_flags(p)
    _sampling_flags(p)
    _server_flag(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("chat", help="interactive chat in the terminal")
    _add_engine_flags(p)
    _sampling_flags(p)
    _server_flag(p)
    p.set_defaults(fn=cmd_chat)
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with the web playground")
    _add_engine_flags(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-queued-requests", type=int, default=256)
    p.add_argument("--extra-model", action="append", help="also serve this model (repeatable; default: the playground's trigram toy model; 'none' for none)")
    p.add_argument("--keep-alive", default="5m",
                   help="how long a model loaded on a request stays loaded after its last one, unless the request "
                        "says (Ollama's keep_alive: '5m', '30s', seconds, -1 forever, 0 at once; default 5m)")
    p.add_argument("--max-loaded-models", type=int, default=3,
                   help="most models loaded at once, the started ones included; the least recently used idle "
                        "one is unloaded for a new one (default 3)")
    p.add_argument("--max-loaded-memory", type=int, default=None, metavar="BYTES",
                   help="most bytes of loaded models (weights file + reserved KV cache each; default 3/4 of RAM)")
    _server_guard_flags(p)
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("pull", help="download a known model into the cache")
    p.add_argument("name", nargs="?")
    p.set_defaults(fn=cmd_pull)
    p = sub.add_parser("models", help="list known models")
    p.set_defaults(fn=cmd_models)
    p = sub.add_parser("plan", help="load a model and show its kernel plan (which numeric path rows take)")
    _add_engine_flags(p)
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("envs", help="list the environment variables hitenter reads, with their values now")
    p.set_defaults(fn=cmd_envs)
    p = sub.add_parser("tokenize", help="show the tokens of a text")
    p.add_argument("text")
    p.add_argument("--model", "-m", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_tokenize)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from hitenter.errors import HitenterError

    try:
        return int(a.fn(a) or 0)
    except (HitenterError, ValueError) as e:
        print(f"hitenter: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
