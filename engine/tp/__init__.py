"""Tensor parallelism (`--tp N`): the decoder's heads, KV heads, MLP units and experts split over
N ranks on one host, torch.distributed with gloo (CPU) or NCCL (CUDA).

- `shard`: which part of each weight a rank holds, and the rank's model built from it.
- `group`: the ranks' process group: all-reduce, and rank 0's broadcasts.
- `runner`: rank 0's model runner, which broadcasts each step's inputs before its forward.
- `launch`: rank 0 starts, feeds and supervises the followers.
- `follower`: a follower's process (`python -m engine.tp.follower`).
"""
