"""Phase names of the policy's steps, and what each training phase holds per backend.

The one source of these names for the steps (:mod:`scopebench.policy.run.steps`), the solvers,
the command-line tools, the reports and the tests. It imports nothing heavy, so a report
reads it without importing torch.

Training phases (the upstream ``profile_step`` breakdown):

* ``dataload_wait``: the next batch, host preprocessing (tokenize, normalise, pad) and the
  copy to the device;
* ``forward``: the forward pass and the weighted loss;
* ``bwd``: the backward pass, including DDP's gradient all-reduce;
* ``unscale_clip``: gradient unscaling (fp16) and clipping;
* ``optim_step``: the optimizer step;
* ``zero_grad_sched``: ``zero_grad`` and the LR scheduler step;
* ``sync_gather``: the per-step gathers of loss terms and memory peaks across ranks and
  their ``.tolist()`` (every ``gather_every`` steps; the region is empty otherwise).

Dataloader phases (``Pi05Dataloader``, ``profile-dataloader``): ``fetch`` (waiting for the
next batch), ``h2d`` (what ``dataload_wait`` adds to it: preprocessing and the copy), and,
when the camera frames are decoded in the process itself (``num_workers: 0``), ``decode``:
that decoding (MP4 or PNG), measured by the dataset and taken out of ``fetch``'s time. With
workers the decoding runs in them, off this process's clock, and ``decode`` is absent.

``backward_step`` (derived) is ``bwd`` through ``zero_grad_sched``. With gradient
accumulation, ``dataload_wait``, ``forward`` and ``bwd`` cover all the micro-batches of the
step. Under DeepSpeed ZeRO, FSDP2 and HSDP the backend does more inside some phases:
:data:`PHASE_CONTENTS`, what each backend says (:mod:`scopebench.train.backends`).
"""

from __future__ import annotations

from scopebench.train.backends import all_backends, get_backend

__all__ = [
    "BACKEND_NAMES",
    "BACKWARD_STEP_PHASES",
    "DATALOADER_PHASES",
    "DECODE_PHASE",
    "INFERENCE_PHASES",
    "PHASE_CONTENTS",
    "TRAIN_PHASES",
    "describe_phases",
]

TRAIN_PHASES = ("dataload_wait", "forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched", "sync_gather")
#: Phases summed into the derived ``backward_step``.
BACKWARD_STEP_PHASES = ("bwd", "unscale_clip", "optim_step", "zero_grad_sched")
DATALOADER_PHASES = ("fetch", "h2d")
#: The dataloader phase present only when the frames are decoded in the process (0 workers).
DECODE_PHASE = "decode"
INFERENCE_PHASES = ("preprocess", "prefill", "denoise", "postprocess")

#: Training backend -> its name in prose.
BACKEND_NAMES: dict[str, str] = {b.name: b.title for b in all_backends()}
#: Backend -> training phase -> what it holds there, for the phases whose work depends on the
#: backend (the other phases hold what the list above says).
PHASE_CONTENTS: dict[str, dict[str, str]] = {b.name: dict(b.phase_contents) for b in all_backends()}


def describe_phases(backend: str) -> str:
    """One line: what the backend-dependent phases hold under ``backend``.

    :Examples:

    >>> describe_phases("ddp")
    "DDP: bwd = backward + DDP's gradient all-reduce; optim_step = AdamW; zero_grad_sched = zero_grad + LR schedule"
    """
    return get_backend(backend).describe_phases()
