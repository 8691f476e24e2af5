"""pi05, the suite's own policy (``policy: pi05``): its config, network, cost and stages.

The room of one built-in policy, as lerobot's ``policies/pi05/`` (a second policy gets a
folder beside it, like :mod:`scopebench.policy.paligemma`):

* :mod:`~scopebench.policy.pi05.config`: one validated dataclass per component, and presets;
* :mod:`~scopebench.policy.pi05.layers`: masks, attention, embeddings, norms, the layers;
* :mod:`~scopebench.policy.pi05.model`: :class:`Pi05Policy`, the network (STYLE.md rule 4);
* :mod:`~scopebench.policy.pi05.flops`: its FLOPs, from the config (STYLE.md rule 5);
* :mod:`~scopebench.policy.pi05.tokenizer`: stand-ins for the prompt and action tokenizers;
* :mod:`~scopebench.policy.pi05.runner`: preprocess / prefill / denoise / postprocess as calls;
* :mod:`~scopebench.policy.pi05.policy`: pi05 as a :class:`~scopebench.policy.user.UserPolicy`
  (:func:`make_pi05_policy`, the factory ``scopebench.policy.pi05:make_pi05_policy``).
"""

from scopebench.policy.pi05.config import PRESETS, Pi05Config, VisionConfig, make_config
from scopebench.policy.pi05.model import Pi05Policy, PrefixCache
from scopebench.policy.pi05.policy import (
    config_for_dataset,
    make_observation,
    make_pi05_policy,
    pi05_args,
    policy_for_dataset,
)

__all__ = [
    "PRESETS",
    "Pi05Config",
    "Pi05Policy",
    "PrefixCache",
    "VisionConfig",
    "config_for_dataset",
    "make_config",
    "make_observation",
    "make_pi05_policy",
    "pi05_args",
    "policy_for_dataset",
]
