"""Hugging Face ``transformers``' PaliGemma as a policy: a third-party model behind the same interface.

* :mod:`~scopebench.policy.paligemma.policy`: :func:`make_paligemma_policy` (the factory
  ``scopebench.policy.paligemma:make_paligemma_policy``) and its synthetic data (:class:`CaptionData`).
"""

from scopebench.policy.paligemma.policy import CaptionData, make_paligemma_policy

__all__ = ["CaptionData", "make_paligemma_policy"]
