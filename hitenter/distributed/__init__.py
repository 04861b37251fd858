"""Past one process: tensor parallelism on torch.distributed (gloo on CPU, NCCL on GPUs).

* group.py  - TPGroup (the model's collectives: all-gather / all-reduce, vocab-parallel embedding / LM head)
* fused.py  - FusedCollectives (the fused C decode layer on a shard: its row-parallel matmuls via the group)
* runner.py - DistributedModelRunner (rank 0: ModelRunner's interface; spawns and stops the workers)
* worker.py - worker_main (ranks 1..N-1: load a shard, mirror rank 0's forwards)
"""

from hitenter.distributed.group import TensorParallelError, validate_tp

__all__ = ["TensorParallelError", "validate_tp"]
