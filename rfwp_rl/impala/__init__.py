"""IMPALA / V-trace actor-learner (Espeholt et al. 2018) for ``rfwp-rl train``.

- :mod:`rfwp_rl.impala.vtrace`: V-trace targets and policy-gradient advantages (IMPALA Eq. 1);
- :mod:`rfwp_rl.impala.learner`: the loss (policy gradient, baseline, entropy) and one update;
- :mod:`rfwp_rl.impala.actors`: env pools (moolib ``EnvPool`` or in-process), double-buffered
  batched inference, rollouts of T+1 steps, learner batches;
- :mod:`rfwp_rl.impala.config`: the defaults (RFWP paper App. C);
- :mod:`rfwp_rl.impala.train`: the CLI and the training loop (resume, logging, checkpoints);
- :mod:`rfwp_rl.impala.remote`, :mod:`rfwp_rl.impala.rollout_server`: remote actors
  (``rfwp-rl actor --connect``) and the learner side that serves them (``train --listen``);
- :mod:`rfwp_rl.impala.broker`, :mod:`rfwp_rl.impala.multi_learner`: several learners training
  one model (``rfwp-rl broker``, ``train --broker --group``);
- :mod:`rfwp_rl.impala.evaluate`: ``rfwp-rl eval`` (the paper's test protocol).

Checkpoints (``<run_dir>/ckpt_<step>.pt``, :class:`rfwp_rl.checkpoint.Checkpointer`) hold
``state["agent"]`` (the model's ``state_dict``) and a ``meta`` dict with everything needed to
rebuild the agent: :func:`rfwp_rl.agent.agent_from_meta`.
"""
