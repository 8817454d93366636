"""Memory-task suite: gymnasium envs under ``rfwp/`` that a policy solves only by remembering.

    env = rfwp_rl.envs.make_env("rfwp/DelayedRecall-easy-v0", delay=20)

Ids, levels and reference returns: :mod:`rfwp_rl.memory.suite`; one module per task.
"""

from rfwp_rl.memory.suite import LEVELS, SUITE, SuiteEntry, entry, normalized_return, register, suite_ids

__all__ = ["LEVELS", "SUITE", "SuiteEntry", "entry", "normalized_return", "register", "suite_ids"]
