"""Quantized weights kept in memory and run by torch's int8 / int4 weight-only CPU kernels."""

from hitenter.quant.head import ExactEmbedding, ExactRows, HeadWeight, RescoredHead
from hitenter.quant.linear import Int4Linear, Int8Linear, quant_linear, weight_bytes
from hitenter.quant.weights import (
                                    QUANTIZATIONS,
                                    Int4Weight,
                                    Int8Weight,
                                    cat_rows,
                                    int4_from_float,
                                    int4_from_gguf_blocks,
                                    int8_from_float,
                                    quantize_weights,
)

__all__ = ["QUANTIZATIONS", "ExactEmbedding", "ExactRows", "HeadWeight", "RescoredHead", "Int4Linear", "Int4Weight", "Int8Linear", "Int8Weight", "cat_rows",
           "int4_from_float", "int4_from_gguf_blocks", "int8_from_float", "quant_linear", "quantize_weights",
           "weight_bytes"]
