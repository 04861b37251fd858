"""EngineConfig: one validated config for the CLI, LLM(...) and the server; every bad value names its field."""

from __future__ import annotations

import dataclasses

import pytest

from hitenter.config import EngineConfig, LoadConfig, SchedulerConfig, SpeculativeConfig, option_fields


@pytest.mark.parametrize("options, field", [
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_seqs": -3}, "max_num_seqs"),
    ({"max_num_seqs": "8"}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"max_queued_requests": -1}, "max_queued_requests"),
    ({"block_size": 0}, "block_size"),
    ({"block_size": 4096}, "block_size"),
    ({"kv_cache_memory": 0}, "kv_cache_memory"),
    ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
    ({"dtype": "fp8"}, "dtype"),
    ({"quantization": "int3"}, "quantization"),
    ({"num_threads": 0}, "num_threads"),
    ({"batch_invariant": 1}, "batch_invariant"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"quantization": "int8", "tensor_parallel_size": 2}, "quantization"),
    ({"num_speculative_tokens": 3}, "num_speculative_tokens"),
    ({"speculative_method": "medusa"}, "speculative_method"),
    ({"speculative_method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"speculative_method": "draft_model"}, "speculative_model"),
    ({"speculative_method": "ngram", "speculative_model": "x.gguf"}, "speculative_model"),
])
def test_bad_values_name_the_field(options, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        EngineConfig.from_options("m.gguf", **options)


def test_zero_is_not_the_default():
    """`or 64` used to turn max_num_seqs=0 into 64; None (not given) is the only way to the default."""
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    assert EngineConfig.from_options(max_num_seqs=None).scheduler.max_num_seqs == 64


def test_old_spellings_are_accepted():
    import torch

    assert LoadConfig(dtype=torch.bfloat16).dtype == "bfloat16" and LoadConfig(dtype="fp32").dtype == "float32"
    assert LoadConfig(quantization="none").quantization is None


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="max_num_seq"):
        EngineConfig.from_options(max_num_seq=4)


def test_frozen_and_round_trip():
    cfg = EngineConfig.from_options("m.gguf", max_num_seqs=4, dtype="bfloat16", quantization="int4",
                                    speculative_model="[ngram]", enable_prefix_caching=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.scheduler.max_num_seqs = 5  # type: ignore[misc]
    assert cfg.load == LoadConfig(model="m.gguf", dtype="bfloat16", quantization="int4")
    assert cfg.speculative == SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=4)
    assert EngineConfig.from_options(**cfg.options()) == cfg
    assert cfg.replace(max_num_seqs=9).scheduler.max_num_seqs == 9


def test_defaults_and_option_names_are_listed_once():
    names = [f.name for _, f in option_fields()]
    assert len(names) == len(set(names))
    cfg = EngineConfig()
    assert (cfg.load.dtype, cfg.load.quantization, cfg.cache.block_size) == ("auto", None, 16)
    assert all("help" in f.metadata for _, f in option_fields())


def test_cli_flags_come_from_the_config():
    from hitenter.cli import build_parser

    a = build_parser().parse_args(["run", "hi", "--max-num-seqs", "3", "--no-enable-prefix-caching",
                                   "--dtype", "bfloat16", "--no-batch-invariant"])
    assert (a.max_num_seqs, a.enable_prefix_caching, a.dtype, a.batch_invariant) == (3, False, "bfloat16", False)
    flags = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()   # type: ignore[union-attr]
    for _, f in option_fields():
        if f.metadata.get("cli") is not False:
            assert (f.metadata.get("flag") or "--" + f.name.replace("_", "-")) in flags
