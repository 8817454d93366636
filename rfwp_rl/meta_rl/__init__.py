"""Meta-RL on random POMDP graphs (FWM paper, Sec. 4.2 and App. I).

- :mod:`rfwp_rl.meta_rl.graph_env`: the graph generator (paper Listing 1), the fixed
  train/test graph sets, the vectorised batch environment and the gymnasium env
  ``PomdpGraphEnv``;
- :mod:`rfwp_rl.meta_rl.a2c`: returns and the A2C loss;
- :mod:`rfwp_rl.meta_rl.model`: policy/value heads on any :mod:`rfwp_rl.cores` core;
- :mod:`rfwp_rl.meta_rl.train`: the ``rfwp-rl meta-rl`` trainer;
- :mod:`rfwp_rl.meta_rl.plot`: the curves in ``results/meta_rl/``.
"""
