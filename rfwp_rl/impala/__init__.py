"""IMPALA / V-trace actor-learner (Espeholt et al. 2018) for ``rfwp-rl train``.

- :mod:`rfwp_rl.impala.config`: the defaults (RFWP paper App. C);
- :mod:`rfwp_rl.impala.run_spec`: the run setup shared by train, actor, eval and the benchmark
  (env, preset, agent, checkpoint meta);
- :mod:`rfwp_rl.impala.vtrace`: V-trace targets and policy-gradient advantages (IMPALA Eq. 1);
- :mod:`rfwp_rl.impala.loss`: the V-trace actor-critic loss (:class:`~rfwp_rl.impala.loss.LossConfig`)
  and the return scale;
- :mod:`rfwp_rl.impala.trust_region`: how far one update may move the policy (``max_kl``);
- :mod:`rfwp_rl.impala.optim`: the optimizer, its LR schedule and one optimizer step;
- :mod:`rfwp_rl.impala.learner`: the :class:`~rfwp_rl.impala.learner.Learner` (agent, optimizer,
  counters, non-finite guard; one update) and :class:`~rfwp_rl.impala.learner.Learning` (updates
  in the calling thread or a learner thread);
- :mod:`rfwp_rl.impala.env_batches`: env pools (moolib ``EnvPool`` or in-process) and their supervision;
- :mod:`rfwp_rl.impala.actors`: double-buffered batched inference, rollouts of T+1 steps, learner batches;
- :mod:`rfwp_rl.impala.train`: the CLI and the training loop;
- :mod:`rfwp_rl.impala.remote`, :mod:`rfwp_rl.impala.rollout_server`: remote actors
  (``rfwp-rl actor --connect``) and the learner side that serves them (``train --listen``);
- :mod:`rfwp_rl.impala.broker`, :mod:`rfwp_rl.impala.multi_learner`: several learners training
  one model (``rfwp-rl broker``, ``train --broker --group``);
- :mod:`rfwp_rl.impala.net`: addresses and settings comparison for the two above;
- :mod:`rfwp_rl.impala.evaluate`: ``rfwp-rl eval`` (the paper's test protocol).

Checkpoints (``<run_dir>/ckpt_<step>.pt``, :class:`rfwp_rl.checkpoint.Checkpointer`) hold
``state["agent"]`` (the model's ``state_dict``) and a ``meta`` dict with everything needed to
rebuild the agent: :meth:`rfwp_rl.impala.run_spec.RunSpec.from_meta`.
"""
