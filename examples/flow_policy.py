"""Your own policy in scopebench: a hand-written flow-matching MLP on synthetic data (docs/policies.md).

scopebench profile-step --config configs/policy/tiny.yml --policy examples/flow_policy.py:make_policy
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

    def __getitem__(self, i):  # a dict of tensors: the suite collates and moves it
        return {"obs": self.obs[i], "actions": self.actions[i]}

    def first(self, batch_size):  # an observation for sample (bench-inference, decompose-latency)
        return {"obs": self.obs[:batch_size]}


class FlowPolicy(nn.Module):
    """The velocity that carries noise (t = 1) to the action chunk (t = 0), given the observation."""

    def __init__(self, obs_dim=16, chunk=8, action_dim=4, hidden=64):
        super().__init__()
        self.shape, d = (chunk, action_dim), chunk * action_dim
        self.net = nn.Sequential(nn.Linear(obs_dim + d + 1, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, obs, x_t, t):  # (B, obs_dim), (B, chunk, action_dim), (B,)
        return self.net(torch.cat([obs, x_t.flatten(1), t[:, None]], dim=1)).view(-1, *self.shape)


def loss(model, batch):  # flow matching: x_t = t * noise + (1 - t) * actions, target noise - actions
    actions, noise = batch["actions"], torch.randn_like(batch["actions"])
    t = torch.rand(len(actions), 1, 1, device=actions.device)
    return nn.functional.mse_loss(model(batch["obs"], t * noise + (1 - t) * actions, t.flatten()), noise - actions)


def sample(model, observation, num_steps):  # Euler steps from noise to actions
    obs = observation["obs"]
    x = torch.randn(len(obs), *model.shape, device=obs.device)
    for i in range(num_steps):
        x = x - model(obs, x, torch.full((len(obs),), 1 - i / num_steps, device=obs.device)) / num_steps
    return x


def make_policy(hidden: int = 64, size: int = 256, seed: int = 0) -> UserPolicy:  # --policy-arg hidden=128
    data = ChunkData(size, seed=seed)
    return UserPolicy(model=FlowPolicy(hidden=hidden), loss=loss, dataset=data, sample=sample, observation=data.first)
