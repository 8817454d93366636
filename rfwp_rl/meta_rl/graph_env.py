"""POMDP graph environments of the FWM paper (Sec. 4.2 and App. I).

Every environment is a directed graph on ``S = 5`` locations with edges labelled by one of
``A = 3`` actions. Actions are deterministic: from a location an action leads to at most one
other location (never to itself); where it leads nowhere it is *invalid*, the agent stays
and pays a penalty. The agent must walk to the reward location; it sees only its own
location and the reward location, never the graph, so it has to learn each graph from its
own experience within the episode (meta-RL).

Graphs are sampled by the algorithm of the paper's Listing 1 (:func:`sample_graph`): one
outgoing edge per location, one incoming edge per location from a (location, action) slot
that is still free, and rejection unless every location reaches every location by a walk of
exactly ``2**S`` steps. That test demands strong connectivity *and* aperiodicity (a
strongly connected graph whose cycle lengths share a factor > 1 is rejected as well). Each
graph has exactly ``2 * S = 10`` valid (location, action) pairs, so 5 of the 15 are invalid.
:func:`sample_graph` makes the same calls on a ``numpy.random.RandomState`` as the listing,
so a data seed gives the same graphs as the paper's code.

Dynamics (App. I): at the start of an episode the reward location is drawn uniformly and the
agent uniformly among the other locations. Reaching the reward location gives +10 and
re-places both (new reward location != old one, agent != new reward location). An invalid
action costs 0.05. A timer counts unsuccessful steps since the last placement; after 6 of
them both are re-placed the same way and the previous-action input shows "none". An episode
has 30 steps.

Observation (17 floats for S = 5, A = 3; index constants below):

====== =====================================================================
index  meaning
====== =====================================================================
0:5    one-hot reward location
5:10   one-hot current location
10     previous action "none" (first step, and after a timeout re-placement)
11:14  one-hot previous action 0, 1, 2
14     bias bit (always 1)
15     progress: step / total steps (0, 1/30, ..., 29/30 at the 30 decisions)
16     reward collected so far in the episode, times ``reward_sum_scale``
====== =====================================================================

Where we differ from the paper's published code, and why:

- App. I puts the raw reward sum in the input; the published code builds that input from a
  per-step buffer that is still zero, so its agents always saw 0 there. We feed the sum
  scaled by ``reward_sum_scale`` (default 1/100, keeping the input O(1) where the raw sum
  reaches ~150); ``reward_sum_scale=0`` reproduces the published code, ``1`` the raw sum.
- The published code places the "none" action on the bias slot (14) and leaves slot 10
  unused; we give "none" its own slot (10) and keep all other indices as published.
- App. I resets the timer when the reward is reached; the published code only resets it on
  a timeout. We follow App. I.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np

from rfwp_rl.errors import UserError, check_choice

NUM_STATES = 5
NUM_ACTIONS = 3
EPISODE_STEPS = 30
GOAL_REWARD = 10.0
INVALID_PENALTY = 0.05
TIMEOUT_STEPS = 6
REWARD_SUM_SCALE = 0.01
DATA_SEED = 666  # the published code's default data seed
NUM_TRAIN_GRAPHS = 600
NUM_TEST_GRAPHS = 600


def obs_size(num_states: int = NUM_STATES, num_actions: int = NUM_ACTIONS) -> int:
    """Length of the observation vector: 2S + (A + 1) + 3 (17 for S = 5, A = 3)."""
    return 2 * num_states + num_actions + 4


def obs_layout(num_states: int = NUM_STATES, num_actions: int = NUM_ACTIONS) -> dict[str, Any]:
    """Where each input sits in the observation vector (slices and indices)."""
    s, a = num_states, num_actions
    return {
        "goal": slice(0, s),
        "location": slice(s, 2 * s),
        "prev_action_none": 2 * s,
        "prev_action": slice(2 * s + 1, 2 * s + 1 + a),
        "bias": 2 * s + a + 1,
        "progress": 2 * s + a + 2,
        "reward_sum": 2 * s + a + 3,
    }


# ---------------------------------------------------------------------------------------------
# graph generator (FWM paper, App. I, Listing 1)


def _reaches_all_in_exactly(adj_any: np.ndarray, squarings: int) -> bool:
    """True if every location reaches every location by a walk of exactly 2**squarings steps
    (boolean version of the listing's repeated squaring of the binarised adjacency)."""
    q = adj_any.astype(np.int64)
    for _ in range(squarings):
        q = (q @ q > 0).astype(np.int64)
    return bool(q.all())


def sample_graph(
    rng: np.random.RandomState, num_actions: int = NUM_ACTIONS, num_states: int = NUM_STATES
) -> np.ndarray:
    """One graph by the algorithm of FWM paper Listing 1.

    Args:
        rng: a legacy ``numpy.random.RandomState``; the same calls as the listing are made,
            so the same seed yields the same graph as the paper's code.
    Returns:
        adjacency ``[A, S, S]`` float64 of 0/1: ``adj[a, i, j] = 1`` iff action a moves the
        agent from location i to location j.
    """
    while True:
        adj = np.zeros((num_actions, num_states, num_states))
        # every location gets an exit: one random action to one random other location
        for src in range(num_states):
            dst = rng.choice([s for s in range(num_states) if s != src])
            act = rng.randint(0, num_actions)
            adj[act, src, dst] = 1
        # every location gets an entrance from a (location, action) slot that is still free;
        # slots are listed action-major as in the listing, the target itself is excluded
        ok = True
        for dst in range(num_states):
            free = [
                (src, act)
                for act in range(num_actions)
                for src in range(num_states)
                if src != dst and not adj[act, src].any()
            ]
            if not free:  # only possible for A < 3; resample
                ok = False
                break
            src, act = free[rng.choice(np.arange(len(free)))]
            adj[act, src, dst] = 1
        # keep it only if all pairs are joined by walks of exactly 2**S steps
        if ok and _reaches_all_in_exactly(adj.any(axis=0), num_states):
            return adj


def adjacency_to_table(adj: np.ndarray) -> np.ndarray:
    """``[..., A, S, S]`` 0/1 adjacency -> transition table ``[..., A, S]`` int8: the next
    location, or -1 where the action is invalid. Raises ValueError if an action has two
    targets (not deterministic)."""
    adj = np.asarray(adj)
    if (adj.sum(-1) > 1).any():
        raise ValueError("adjacency has an action with more than one target")
    return np.where(adj.any(-1), adj.argmax(-1), -1).astype(np.int8)


def table_to_adjacency(table: np.ndarray) -> np.ndarray:
    """Transition table ``[..., A, S]`` -> adjacency ``[..., A, S, S]`` uint8."""
    table = np.asarray(table)
    num_states = table.shape[-1]
    adj = (table[..., None] == np.arange(num_states)).astype(np.uint8)
    return adj


def strongly_connected(table: np.ndarray) -> bool:
    """True if every location reaches every other one (breadth-first search), for one
    transition table ``[A, S]``."""
    table = np.asarray(table)
    num_states = table.shape[-1]
    for start in range(num_states):
        seen, frontier = {start}, [start]
        while frontier:
            nxt = {int(t) for s in frontier for t in table[:, s] if t >= 0} - seen
            seen |= nxt
            frontier = list(nxt)
        if len(seen) != num_states:
            return False
    return True


def generate_graphs(
    n: int,
    rng: np.random.RandomState,
    exclude: set[bytes] | None = None,
    num_actions: int = NUM_ACTIONS,
    num_states: int = NUM_STATES,
) -> np.ndarray:
    """``n`` transition tables ``[n, A, S]`` int8 from Listing 1, skipping any graph whose
    table bytes are in ``exclude`` (as the published code does for the training set)."""
    out = np.empty((n, num_actions, num_states), dtype=np.int8)
    for i in range(n):
        while True:
            table = adjacency_to_table(sample_graph(rng, num_actions, num_states))
            if not exclude or table.tobytes() not in exclude:
                break
        out[i] = table
    return out


@functools.lru_cache(maxsize=8)
def graph_sets(
    data_seed: int = DATA_SEED,
    num_train: int = NUM_TRAIN_GRAPHS,
    num_test: int = NUM_TEST_GRAPHS,
    num_actions: int = NUM_ACTIONS,
    num_states: int = NUM_STATES,
) -> tuple[np.ndarray, np.ndarray]:
    """The fixed training and test graphs of a data seed, as read-only transition tables
    ``(train [num_train, A, S], test [num_test, A, S])`` int8.

    As in the published code, the test graphs are drawn first and training graphs identical
    to a test graph are redrawn, so no test graph is a training graph (repeats inside one
    set are allowed, as there)."""
    if num_train < 1 or num_test < 0:
        raise UserError(f"graph set sizes must be positive, got train={num_train}, test={num_test}")
    rng = np.random.RandomState(data_seed)
    test = generate_graphs(num_test, rng, None, num_actions, num_states)
    train = generate_graphs(num_train, rng, {t.tobytes() for t in test}, num_actions, num_states)
    train.setflags(write=False)
    test.setflags(write=False)
    return train, test


# ---------------------------------------------------------------------------------------------
# vectorised environment


class GraphBatchEnv:
    """``B`` agents stepped together; agent ``b`` lives on graph ``tables[b]`` (NumPy).

    Args:
        tables: transition tables ``[B, A, S]`` (next location or -1 for invalid).
        episode_steps, goal_reward, invalid_penalty, timeout_steps, reward_sum_scale: see
            the module docstring (paper values by default).
        rng: a ``numpy.random.Generator`` or a seed for the placements.

    ``reset() -> obs [B, obs_size] float32``; ``step(actions [B] int) -> (obs, reward [B]
    float32, done: bool)``; ``done`` is True after ``episode_steps`` steps (all agents end
    together). State arrays ``agent``, ``goal``, ``prev_action`` (A means "none"),
    ``timer``, ``reward_sum`` and the per-episode counters ``goals``, ``invalid``,
    ``timeouts`` ``[B]`` are public; tests set ``agent``/``goal`` directly.
    """

    def __init__(
        self,
        tables: np.ndarray,
        *,
        episode_steps: int = EPISODE_STEPS,
        goal_reward: float = GOAL_REWARD,
        invalid_penalty: float = INVALID_PENALTY,
        timeout_steps: int = TIMEOUT_STEPS,
        reward_sum_scale: float = REWARD_SUM_SCALE,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        tables = np.asarray(tables)
        if tables.ndim != 3:
            raise ValueError(f"tables must be [B, A, S], got shape {tables.shape}")
        b, a, s = tables.shape
        if s < 2 or a < 1 or b < 1:
            raise ValueError(f"need B >= 1, A >= 1, S >= 2; got tables of shape {tables.shape}")
        if tables.min() < -1 or tables.max() >= s:
            raise ValueError(f"table entries must be -1 (invalid) or a location 0..{s - 1}")
        if episode_steps < 1 or timeout_steps < 1:
            raise ValueError("episode_steps and timeout_steps must be >= 1")
        self.tables = tables.astype(np.int64)
        self.num_envs, self.num_actions, self.num_states = b, a, s
        self.obs_size = obs_size(s, a)
        self.layout = obs_layout(s, a)
        self.episode_steps = episode_steps
        self.goal_reward = float(goal_reward)
        self.invalid_penalty = float(invalid_penalty)
        self.timeout_steps = timeout_steps
        self.reward_sum_scale = float(reward_sum_scale)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self._rows = np.arange(b)
        self.t = episode_steps  # no episode running until reset()
        zeros = np.zeros(b, dtype=np.int64)
        self.agent, self.goal, self.timer = zeros.copy(), zeros.copy(), zeros.copy()
        self.prev_action = np.full(b, a, dtype=np.int64)
        self.reward_sum = np.zeros(b)
        self.goals, self.invalid, self.timeouts = zeros.copy(), zeros.copy(), zeros.copy()

    def reset(self) -> np.ndarray:
        """Start a new episode for all agents; returns the first observation ``[B, obs]``."""
        s, b = self.num_states, self.num_envs
        self.goal = self.rng.integers(0, s, size=b)
        self.agent = (self.goal + self.rng.integers(1, s, size=b)) % s  # uniform != goal
        self.prev_action = np.full(b, self.num_actions, dtype=np.int64)
        self.timer = np.zeros(b, dtype=np.int64)
        self.reward_sum = np.zeros(b)
        self.goals, self.invalid, self.timeouts = (np.zeros(b, dtype=np.int64) for _ in range(3))
        self.t = 0
        return self.observe()

    def observe(self) -> np.ndarray:
        """The current observation ``[B, obs_size]`` float32 (layout in the module docstring)."""
        s, a, lay = self.num_states, self.num_actions, self.layout
        obs = np.zeros((self.num_envs, self.obs_size), dtype=np.float32)
        obs[self._rows, self.goal] = 1.0
        obs[self._rows, s + self.agent] = 1.0
        # "none" (= A) goes to slot 2S, action k to slot 2S + 1 + k
        obs[self._rows, 2 * s + (self.prev_action + 1) % (a + 1)] = 1.0
        obs[:, lay["bias"]] = 1.0
        obs[:, lay["progress"]] = self.t / self.episode_steps
        obs[:, lay["reward_sum"]] = self.reward_sum * self.reward_sum_scale
        return obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """Apply one action per agent. Returns ``(obs [B, obs], reward [B] float32, done)``."""
        if self.t >= self.episode_steps:
            raise RuntimeError("the episode is over (or never started); call reset()")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {actions.shape}")
        actions = actions.astype(np.int64)
        if actions.min() < 0 or actions.max() >= self.num_actions:
            raise ValueError(f"actions must be in 0..{self.num_actions - 1}")
        nxt = self.tables[self._rows, actions, self.agent]
        invalid = nxt < 0
        self.agent = np.where(invalid, self.agent, nxt)  # an invalid action leaves the agent
        reached = ~invalid & (self.agent == self.goal)
        reward = np.where(reached, self.goal_reward, 0.0) - np.where(invalid, self.invalid_penalty, 0.0)
        self.timer = np.where(reached, 0, self.timer + 1)  # App. I: reset on reaching the reward
        self.prev_action = actions
        timeout = self.timer >= self.timeout_steps
        self._replace(reached | timeout)
        self.prev_action = np.where(timeout, self.num_actions, self.prev_action)
        self.timer = np.where(timeout, 0, self.timer)
        self.reward_sum = self.reward_sum + reward
        self.goals += reached
        self.invalid += invalid
        self.timeouts += timeout
        self.last_reached, self.last_invalid, self.last_timeout = reached, invalid, timeout
        self.t += 1
        return self.observe(), reward.astype(np.float32), self.t >= self.episode_steps

    def _replace(self, mask: np.ndarray) -> None:
        """New reward location != the old one, new agent location != the new reward location."""
        idx = np.flatnonzero(mask)
        s = self.num_states
        goal = (self.goal[idx] + self.rng.integers(1, s, size=idx.size)) % s
        agent = (goal + self.rng.integers(1, s, size=idx.size)) % s
        self.goal = self.goal.copy()
        self.agent = self.agent.copy()
        self.goal[idx], self.agent[idx] = goal, agent

    def rng_state(self) -> dict:
        """State of the placement RNG (for checkpoints)."""
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


# ---------------------------------------------------------------------------------------------
# single gymnasium environment


class PomdpGraphEnv(gym.Env):
    """One agent on one POMDP graph, as a gymnasium env (id ``rfwp_rl/PomdpGraph-v0``).

    Args:
        graphs: ``"train"`` or ``"test"`` (the fixed sets of ``data_seed``) or ``"random"``
            (a fresh Listing-1 graph at every reset).
        graph_index: always use this graph of the set; None picks one at random per reset
            (``reset(options={"graph_index": i})`` also chooses).
        data_seed, num_train, num_test: the graph sets (:func:`graph_sets`).
        other arguments: as :class:`GraphBatchEnv`.

    Observation ``Box(obs_size,)`` float32 (layout in the module docstring), action
    ``Discrete(3)``. The episode terminates after ``episode_steps`` steps (the progress input
    makes the horizon part of the state, so this is a true terminal). ``info`` holds
    ``graph_index``, ``agent``, ``goal`` and, after a step, ``reached``, ``invalid``, ``timeout``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        graphs: str = "train",
        graph_index: int | None = None,
        data_seed: int = DATA_SEED,
        num_train: int = NUM_TRAIN_GRAPHS,
        num_test: int = NUM_TEST_GRAPHS,
        episode_steps: int = EPISODE_STEPS,
        goal_reward: float = GOAL_REWARD,
        invalid_penalty: float = INVALID_PENALTY,
        timeout_steps: int = TIMEOUT_STEPS,
        reward_sum_scale: float = REWARD_SUM_SCALE,
        render_mode: str | None = None,
    ) -> None:
        check_choice("graph set", graphs, ("train", "test", "random"))
        if render_mode is not None:
            check_choice("render mode", render_mode, self.metadata["render_modes"])
        self.graphs = graphs
        self.render_mode = render_mode
        self._tables = None
        if graphs != "random":
            train, test = graph_sets(data_seed, num_train, num_test)
            self._tables = train if graphs == "train" else test
            if graph_index is not None and not 0 <= graph_index < len(self._tables):
                raise UserError(f"graph_index {graph_index} out of range 0..{len(self._tables) - 1}")
        self.graph_index = graph_index
        self._kwargs = dict(
            episode_steps=episode_steps,
            goal_reward=goal_reward,
            invalid_penalty=invalid_penalty,
            timeout_steps=timeout_steps,
            reward_sum_scale=reward_sum_scale,
        )
        n = obs_size()
        lo, hi = np.zeros(n, np.float32), np.ones(n, np.float32)
        bounds = sorted(
            [-invalid_penalty * episode_steps * reward_sum_scale, goal_reward * episode_steps * reward_sum_scale]
        )
        lo[-1], hi[-1] = bounds
        self.observation_space = gym.spaces.Box(lo, hi, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self._env: GraphBatchEnv | None = None
        self._index = -1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        index = (options or {}).get("graph_index", self.graph_index)
        if self._tables is None:
            table = adjacency_to_table(sample_graph(np.random.RandomState(int(self.np_random.integers(2**31)))))
            index = -1
        else:
            if index is None:
                index = int(self.np_random.integers(len(self._tables)))
            table = self._tables[index]
        self._index = int(index)
        self._env = GraphBatchEnv(table[None], rng=self.np_random, **self._kwargs)
        obs = self._env.reset()[0]
        return obs, self._info()

    def step(self, action):
        if self._env is None:
            raise RuntimeError("call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        obs, reward, done = self._env.step(np.array([int(action)]))
        info = self._info()
        info.update(
            reached=bool(self._env.last_reached[0]),
            invalid=bool(self._env.last_invalid[0]),
            timeout=bool(self._env.last_timeout[0]),
        )
        return obs[0], float(reward[0]), bool(done), False, info

    @property
    def table(self) -> np.ndarray:
        """The current graph's transition table ``[A, S]`` (-1 = invalid)."""
        if self._env is None:
            raise RuntimeError("call reset() first")
        return self._env.tables[0].copy()

    def _info(self) -> dict:
        e = self._env
        return {"graph_index": self._index, "agent": int(e.agent[0]), "goal": int(e.goal[0])}

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._env is None:
            return None
        e = self._env
        edges = ", ".join(
            f"{s}-{a}->{int(e.tables[0, a, s])}"
            for s in range(e.num_states)
            for a in range(e.num_actions)
            if e.tables[0, a, s] >= 0
        )
        return (
            f"step {e.t}/{e.episode_steps} agent {int(e.agent[0])} goal {int(e.goal[0])} "
            f"reward so far {e.reward_sum[0]:.2f} | edges {edges}"
        )
