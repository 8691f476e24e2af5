"""What both imaging benchmarks share: pictures, quality metrics, the denoiser registry and weight files.

* :mod:`~scopebench.imaging.common.images`: bundled natural pictures, phantom, synthetic volumes;
* :mod:`~scopebench.imaging.common.metrics`: PSNR / SSIM / MSE, one definition for the suite;
* :mod:`~scopebench.imaging.common.architectures`: a learned denoiser's architecture (``DenoiserSpec``);
* :mod:`~scopebench.imaging.common.denoisers`: denoiser names, configurations and builders;
* :mod:`~scopebench.imaging.common.weights`: writing, checking and loading weight files.
"""
