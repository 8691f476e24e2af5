"""A policy that carries state across calls: it attends over the episode's past observations
(docs/policies.md, "Policies with state").

scopebench bench-inference --config configs/policy/tiny.yml \\
    --policy examples/stateful_policy.py:make_policy --episode-length 20

``reset(model)`` starts an episode with an empty history; each ``sample`` call appends the
observation's embedding to it and returns ``(actions, history)``, so a call's latency grows
with its place in the episode (up to ``max_history`` observations), which ``bench-inference``
reports by place.
"""

import torch
from torch import nn
from torch.utils.data import Dataset

from scopebench.policy import UserPolicy


class ChunkData(Dataset):
    """Observations and the action chunks a fixed linear map makes of them."""

    def __init__(self, size=256, obs_dim=16, chunk=8, action_dim=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(size, obs_dim, generator=g)
        self.actions = (self.obs @ torch.randn(obs_dim, chunk * action_dim, generator=g)).view(size, chunk, action_dim)

    def __len__(self):
        return len(self.obs)

    def __getitem__(self, i):
        return {"obs": self.obs[i], "actions": self.actions[i]}

    def first(self, batch_size):
        return {"obs": self.obs[:batch_size]}


class HistoryPolicy(nn.Module):
    """Action chunk = MLP(observation embedding + attention over the episode's past embeddings)."""

    def __init__(self, obs_dim=16, chunk=8, action_dim=4, hidden=64):
        super().__init__()
        self.shape = (chunk, action_dim)
        self.embed = nn.Linear(obs_dim, hidden)
        self.head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.GELU(), nn.Linear(hidden, chunk * action_dim))

    def forward(self, obs, history=None):  # (B, obs_dim), (B, T, hidden) or None
        e = self.embed(obs)
        history = e[:, None] if history is None else torch.cat([history, e[:, None]], dim=1)
        weights = torch.softmax((history @ e[:, :, None]).squeeze(-1) / e.shape[-1] ** 0.5, dim=1)
        context = (weights[:, :, None] * history).sum(1)
        return self.head(torch.cat([e, context], dim=1)).view(-1, *self.shape), history


def loss(model, batch):  # one-step episodes in training: the history is the observation itself
    actions, _ = model(batch["obs"])
    return nn.functional.mse_loss(actions, batch["actions"])


def make_policy(hidden: int = 64, size: int = 256, max_history: int = 256, seed: int = 0) -> UserPolicy:
    data = ChunkData(size, seed=seed)

    def reset(model):  # the start of an episode: nothing seen yet
        return None

    def sample(model, observation, num_steps, history):  # one chunk; the history goes to the next call
        actions, history = model(observation["obs"], history)
        return actions, history[:, -max_history:]

    return UserPolicy(
        model=HistoryPolicy(hidden=hidden), loss=loss, dataset=data, sample=sample, observation=data.first, reset=reset
    )
