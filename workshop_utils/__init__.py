"""Companion package of the workshop "HPC for deep learning with PyTorch".

The notebooks, command-line entries and Slurm jobs all import from here, so there
is one data pipeline, one model zoo and one training loop. Import it flat::

    import workshop_utils as wu
    result = wu.train(wu.TrainConfig(model="simplecnn", precision="bf16"))

Names load on first use (PEP 562): ``import workshop_utils`` stays fast, and the
modules that are also commands (``python -m workshop_utils.data``) run cleanly.
"""

from importlib import import_module

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "check_baseline": "checks", "summary_table": "checks",
    "latest_checkpoint": "checkpoint", "list_checkpoints": "checkpoint", "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "CLASSES": "data", "CifarData": "data", "DeviceLoader": "data", "TorchLoader": "data", "load_data": "data",
    "make_loader": "data", "make_synthetic_cifar": "data", "read_cifar10": "data", "verify_cifar10": "data",
    "DistInfo": "distributed", "all_reduce_sum": "distributed", "read_dist_env": "distributed",
    "setup_distributed": "distributed", "teardown_distributed": "distributed",
    "WorkshopError": "errors", "install_notebook_error_handler": "errors",
    "achieved_tflops": "flops", "mfu": "flops", "training_flops_per_sample": "flops",
    "PEAK_TFLOPS": "hardware", "PRECISIONS": "hardware", "check_precision": "hardware", "environment": "hardware",
    "environment_table": "hardware", "peak_tflops": "hardware", "pick_device": "hardware",
    "MODELS": "models", "SimpleCNN": "models", "build_model": "models", "count_parameters": "models",
    "max_parameter_difference": "models", "parameter_checksum": "models", "resnet18_cifar": "models",
    "unwrap": "models",
    "plot_bars": "plots", "plot_step_times": "plots", "plot_training_curves": "plots", "save_figure": "plots",
    "autocast": "precision", "configure_precision": "precision", "grad_scaler": "precision", "set_tf32": "precision",
    "pick_settings": "profiles", "resolve_profile": "profiles",
    "add_report_section": "report", "write_report": "report",
    "load_results": "results", "new_run_dir": "results", "read_records": "results", "resolve_run_dir": "results",
    "save_record": "results",
    "StepTimer": "timing", "peak_memory_mib": "timing",
    "InjectedFailure": "trainer", "RunResult": "trainer", "TrainConfig": "trainer", "evaluate": "trainer",
    "train": "trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'workshop_utils' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
