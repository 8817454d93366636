"""rfwp_rl: reinforcement learning with Recurrent Fast Weight Programmers.

Subpackages: ``cores`` (shared recurrent cores), ``ops`` (fast-weight recurrences:
PyTorch reference + dispatch to fused kernels), ``kernels`` (Python side of ``csrc/``),
``impala`` (IMPALA/V-trace actor-learner), ``meta_rl`` (POMDP graphs + A2C),
``seq`` (language modelling and algorithmic tasks), ``envs`` (environment factories).
"""

__version__ = "0.1.0"
