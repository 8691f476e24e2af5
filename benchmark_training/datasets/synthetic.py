"""Synthetic supervised pairs: natural-image crops (2-D) or synthetic volumes (3-D).

``operator``: ``blur`` (deblurring), ``downsampling`` (x2 super-resolution) or
``denoising_3d``. Crops come from scikit-image's bundled pictures (offline), validation
crops from held-out pictures. Deterministic given ``seed``: distributed ranks rebuild the
same set from ``data_params``.
"""

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "synthetic"
    parameters = {
        "image_size": [32],
        "operator": ["blur"],
        "noise_level": [0.03],
        "n_train": [64],
        "n_val": [8],
        "seed": [0],
        "channels": [None],
    }
    test_parameters = {"image_size": [16], "n_train": [8], "n_val": [2]}

    def get_data(self):
        from scopebench.imaging.training import build_training_data

        data = build_training_data(**{key: getattr(self, key) for key in self.parameters})
        return dict(data=data, data_params=data.spec.to_dict())
