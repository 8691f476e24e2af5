"""The shipped accelerate config files: backends, what the suite reads, canaries for accelerate's loader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from scopebench.train import (
    BACKEND_FILES,
    AcceleratorSettings,
    deepspeed_config,
    load_accelerate_file,
    settings_in_force,
    shipped_accelerate_file,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", sorted(BACKEND_FILES))
def test_each_shipped_file_selects_its_backend_and_configs_links_to_them(backend):
    path = shipped_accelerate_file(backend)
    file = load_accelerate_file(path)
    assert file.backend.name == backend and file.num_processes == 2 and file.precision == "bf16"
    assert (REPO / "configs" / "accelerate" / path.name).resolve() == path.resolve()
    if backend in ("ddp", "fsdp2", "hsdp"):
        assert file.zero == {} and file.zero_stage is None
        assert (file.fsdp is None) == (backend == "ddp")
        assert (file.mesh is None) == (backend != "hsdp")
    else:
        assert file.zero_stage == int(backend[-1]) and file.zero["offload_optimizer_device"] == "none"
        assert file.gradient_accumulation_steps == 1 and file.gradient_clipping == 1.0


@pytest.mark.parametrize("backend", sorted(BACKEND_FILES))
def test_canary_accelerate_reads_the_shipped_files(backend):
    """``accelerate launch --config_file`` parses them (unknown keys would fail there)."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(shipped_accelerate_file(backend)))
    kind = {"ddp": "MULTI_GPU", "fsdp2": "FSDP", "hsdp": "FSDP"}.get(backend, "DEEPSPEED")
    assert str(config.distributed_type).endswith(kind)
    if backend.startswith("zero"):
        assert config.deepspeed_config["zero_stage"] == int(backend[-1])
    if backend in ("fsdp2", "hsdp"):
        assert config.fsdp_config["fsdp_version"] == 2
    assert bool(config.parallelism_config) == (backend == "hsdp")  # what selects hsdp, as accelerate reads it


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("distributed_type: XLA\n", r"distributed_type in .*bad.yaml must be one of"),
        ("distributed_type: FSDP\n", r"fsdp_config.fsdp_version in .*bad.yaml must be one of 2, got 1"),
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 4\n",
            r"zero_stage in .*must be one of 1, 2, 3, got 4",
        ),
        ("num_processes: 0\n", r"num_processes in .*must be an integer >= 1, got 0"),
        ("mixed_precision: fp8\n", r"mixed_precision in .* must be one of"),
        ("- a\n- b\n", r"must hold a mapping"),
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  deepspeed_config_file: ds.json\n",
            r"a separate DeepSpeed JSON is not supported",
        ),
    ],
)
def test_bad_files_name_the_file_and_key(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_accelerate_file(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="accelerate config file not found: .*nope.yaml"):
        load_accelerate_file(tmp_path / "nope.yaml")


def test_the_training_config_wins_and_says_so():
    file = load_accelerate_file(shipped_accelerate_file("zero2"))
    settings = SimpleNamespace(precision="fp32", gradient_accumulation_steps=4, grad_clip=1.0)
    lines = settings_in_force(file, settings)
    assert lines == [
        "precision=fp32 (the training config; deepspeed_zero2.yaml says mixed_precision=bf16)",
        "gradient_accumulation_steps=4 (the training config; deepspeed_zero2.yaml says gradient_accumulation_steps=1)",
        "grad_clip=1.0 (the training config)",
    ]


def test_the_deepspeed_config_carries_the_training_values_and_the_files_knobs():
    file = load_accelerate_file(shipped_accelerate_file("zero3"))
    settings = AcceleratorSettings(
        backend="zero3", micro_batch_size=6, gradient_accumulation_steps=3, grad_clip=0.5, zero=file.zero
    )
    cfg = deepspeed_config(settings)
    assert cfg["train_micro_batch_size_per_gpu"] == 6 and cfg["gradient_accumulation_steps"] == 3
    assert cfg["gradient_clipping"] == 0.5 and cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_param"] == {"device": "none"}
    assert cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False
