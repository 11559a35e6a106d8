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
    "ProfileRun": "profiling", "profile_training": "profiling", "top_ops": "profiling",
    "DeviceMonitor": "monitor", "StepMemory": "monitor", "monitor_verdict": "monitor", "plot_monitor": "monitor",
    "compare_layouts": "io_layouts", "loader_throughput": "io_layouts", "read_shards": "io_layouts",
    "read_small_files": "io_layouts", "write_shards": "io_layouts", "write_small_files": "io_layouts",
    "Rung": "sweeps", "amdahl_speedup": "sweeps", "batch_size_sweep": "sweeps", "climb_ladder": "sweeps",
    "dataloader_sweep": "sweeps", "ladder_rungs": "sweeps", "worker_counts": "sweeps",
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


# notebook 03's numerics helpers (workshop_utils/numerics.py), loaded lazily like the rest
_EXPORTS.update(dict.fromkeys((
    "NonFinite", "autocast_dtypes", "capture_gradients", "check_fp8", "dtype_summary", "find_first_nonfinite",
    "format_table", "fp8_matmul_benchmark", "fp8_support", "grad_scaler_trace", "mode_table", "overshoot",
    "plot_gradient_magnitudes", "plot_mode_speeds", "plot_scale_trace", "precision_configs", "smallest_subnormal",
    "training_batches", "underflow_table"), "numerics"))
__all__ = sorted(_EXPORTS)

# notebook 02's multi-process helpers (comm_model.py, launch.py), loaded lazily like the rest
_EXPORTS.update(dict.fromkeys((
    "LINKS", "Link", "fit_link", "plot_all_reduce", "plot_predicted_vs_measured", "plot_scaling",
    "predict_scaling", "ring_all_reduce_s", "scaling_table"), "comm_model"))
_EXPORTS.update(dict.fromkeys((
    "Launched", "free_port", "launch_torchrun", "launch_nodes", "launch_training", "world_sizes_for_this_machine"), "launch"))
_EXPORTS["stop_on_signals"] = "preemption"
__all__ = sorted(_EXPORTS)
