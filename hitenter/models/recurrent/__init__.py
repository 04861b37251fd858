"""Recurrent token mixers of hybrid models: layers that keep a fixed-size state per sequence (a causal
convolution's tail, a state matrix) instead of a KV cache. `base.py` holds the state tensors and the
contract every mixer follows; one file per mixer kind (the value of ModelConfig.layer_types)."""
