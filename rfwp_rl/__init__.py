"""rfwp_rl: reinforcement learning with Recurrent Fast Weight Programmers.

Subpackages: ``cores`` (shared recurrent cores), ``ops`` (fast-weight recurrences:
PyTorch reference + dispatch to fused kernels), ``kernels`` (Python side of ``csrc/``),
``impala`` (IMPALA/V-trace actor-learner), ``meta_rl`` (POMDP graphs + A2C),
``seq`` (language modelling and algorithmic tasks), ``envs`` (environment factories),
``bench`` (``rfwp-rl bench``). ``resources`` finds the data folders read at run time
(``csrc/``, ``agents/``, ``results/paper/``: the checkout's, or the copies shipped in a wheel).
The command line: ``rfwp-rl`` (:mod:`rfwp_rl.cli`).
"""

__version__ = "0.1.0"
