"""Companion package of the workshop "HPC for deep learning with PyTorch".

The notebooks, command-line entries and Slurm jobs all import from here, so there
is one data pipeline, one model zoo and one training loop. Import it flat::

    import workshop_utils as wu
    result = wu.train(wu.TrainConfig(model="simplecnn", precision="bf16"))

Names load on first use (PEP 562): ``import workshop_utils`` stays fast, and the
modules that are also commands (``python -m workshop_utils.data``) run cleanly.
"""

import os
import sys
import types
from importlib import import_module

__version__ = "0.1.0"

# Kineto leaves CUPTI attached to the process after a torch.profiler session unless TEARDOWN_CUPTI=1
# (pytorch/pytorch#144455): every later kernel launch then pays CUPTI's callbacks, and a step timed after a
# profiled one is slower for it (GPT-2 small ran 1.66x slower on an H100 after three profiler sessions in one
# process). Set before anything can start a session, here and in spine.timing.profiler; a value the user set wins.
os.environ.setdefault("TEARDOWN_CUPTI", "1")

# module -> the public names it defines
_MODULES = {
    "spine.checkpoint": (
        "latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint",
    ),
    "lessons.accumulation": (
        "accumulation_table", "step_time_change",
    ),
    "lessons.checks": (
        "EXPECTED", "check_baseline", "layer_intensities", "recorded_spread_points", "seed_spread", "summary_table",
        "what_you_should_see",
    ),
    "exercises.ddp_lab": (
        "LabRun", "attendee_script", "check_average_gradients", "check_ddp_efficiency", "check_ddp_lab",
        "lab_device", "lab_folder", "run_single", "solve_ddp_lab", "start_ddp_lab",
    ),
    "exercises.exercise_cells": (
        "NotYet", "Unsolved", "solved",
    ),
    "handout": (
        "attendee_notebook", "write_attendee_notebooks",
    ),
    "exercises.exercise_inputs": (
        "watch_exercise_inputs",
    ),
    "exercises.exercise_checks": (
        "check_achieved_tflops", "check_amp_step", "check_batch_memory", "check_fewest_gpus", "check_fsdp_traffic",
        "check_loader_choice", "check_lost_fraction", "check_matmul_tflops", "check_mfu", "check_microbatches",
        "check_next_fix", "check_safe_loss_scale", "check_flops_per_token", "check_micro_batch_plan",
    ),
    "parallel.collectives": (
        "COLLECTIVES", "collective_table", "collectives_frame", "fit_all_reduce", "plot_collective_times",
        "ring_time_s", "run_collective", "show_collectives", "time_collectives",
    ),
    "parallel.comm_model": (
        "LINKS", "Link", "LinkPlan", "ddp_buckets", "exposed_communication_s", "fit_link", "link_measurement_plan",
        "plot_all_reduce", "plot_predicted_vs_measured", "plot_scaling",
        "predict_scaling", "ring_all_reduce_s", "scaling_table",
    ),
    "spine.data": (
        "CLASSES", "CifarData", "DeviceLoader", "TorchLoader", "load_data", "make_loader",
        "make_synthetic_cifar", "read_cifar10", "verify_cifar10",
    ),
    "parallel.failures": (
        "RankFailed", "RankFailure", "RootCause", "record_failure", "record_failures", "root_cause",
    ),
    "parallel.dist_checkpoint": (
        "checkpoint_stall", "full_parameter_checksum", "load_into_one_process", "sharded_round_trip", "stall_summary",
    ),
    "spine.distributed": (
        "DistInfo", "all_reduce_sum", "collective_device", "gpu_for_local_rank", "rank_device", "read_dist_env",
        "setup_distributed", "teardown_distributed",
    ),
    "system.benchmark": (
        "benchmark_frame", "benchmark_parser", "median_run", "read_benchmarks", "start_benchmark", "write_benchmark",
    ),
    "system.display": (
        "Table", "show_environment", "show_table", "show_verdict",
    ),
    "system.errors": (
        "WorkshopError", "install_notebook_error_handler",
    ),
    "spine.flops": (
        "achieved_tflops", "mfu", "training_flops_per_sample", "training_flops_per_sequence",
    ),
    "spine.gpt": (
        "GPT", "GPT_SIZES", "GPTSize", "activation_bytes_per_sequence", "build_gpt", "flops_per_token_closed_form",
        "largest_micro_batch",
    ),
    "system.hardware": (
        "PEAK_TFLOPS", "PRECISIONS", "check_precision", "cpu_16bit_support", "environment", "environment_table", "peak_tflops",
        "peak_note", "wait_passively", "mig_share", "device_name", "pick_device",
    ),
    "lessons.io_layouts": (
        "compare_layouts", "loader_throughput", "read_shards", "read_small_files", "write_shards",
        "write_small_files",
    ),
    "parallel.launch": (
        "Launched", "NodeLayout", "free_port", "launch_nodes", "launch_torchrun", "launch_training",
        "node_layout", "resume_verdict", "world_sizes_for_this_machine",
    ),
    "spine.models": (
        "MODELS", "SimpleCNN", "TOKEN_MODELS", "build_model", "count_parameters", "max_parameter_difference",
        "parameter_checksum", "resnet18_cifar", "state_checksum", "unwrap",
    ),
    "lessons.monitor": (
        "DeviceMonitor", "StepMemory", "monitor_verdict", "plot_monitor", "stopped_by_memory",
    ),
    "lessons.numerics": (
        "NonFinite", "accuracy_parity", "autocast_dtypes", "capture_gradients", "check_fp8", "dtype_summary",
        "find_first_nonfinite", "format_table", "fp8_matmul_benchmark", "fp8_support", "grad_scaler_trace",
        "mode_table", "overflowing_scale", "overshoot", "overshoot_until_nonfinite", "plot_gradient_magnitudes",
        "plot_mode_speeds", "plot_scale_trace",
        "precision_configs", "precision_plan", "gpu_reference_speedup", "smallest_subnormal", "training_batches", "underflow_table",
    ),
    "lessons.precision_sweep": (
        "plot_precision_batch_sweep", "precision_batch_sweep", "speedup_by_batch", "step_memory",
    ),
    "parallel.overlap": (
        "measure_overlap", "overlap_sentence", "overlap_table", "plot_overlap",
    ),
    "parallel_demos": (
        "PARTS", "demo_world", "launch_demo",
    ),
    "parallel.pipeline": (
        "bubble_fraction", "bubble_table", "gpipe_step", "measure_bubble", "plot_pipeline",
    ),
    "lessons.plots": (
        "plot_bars", "plot_batch_sweep", "plot_step_times", "plot_training_curves", "save_figure",
    ),
    "spine.precision": (
        "autocast", "configure_precision", "emulated_on_cpu", "grad_scaler", "set_tf32",
    ),
    "spine.preemption": (
        "stop_on_signals",
    ),
    "system.profiles": (
        "notebook_profiles", "pick_settings", "profile_choice", "resolve_profile",
    ),
    "lessons.profiling": (
        "ProfileRun", "attention_kernels", "nsys_command", "nsys_missing", "nsys_profile", "plot_step_breakdown",
        "profile_rungs", "profile_training", "step_breakdown", "tensor_memory_by_step", "top_ops",
    ),
    "exercises.job_script": (
        "JOB_SCRIPT", "fill_job_script",
    ),
    "exercises.slurm_exercises": (
        "array_tasks", "check_array_sweep", "check_job_script", "check_job_usage", "next_request", "script_problem",
        "sweep_problem",
    ),
    "lessons.recompute": (
        "BlockStack", "measure_gpt_recompute", "measure_recompute",
    ),
    "report": (
        "add_report_section", "write_report",
    ),
    "system.results": (
        "check_output_path", "fresh_folder", "load_results", "new_run_dir", "read_records", "resolve_run_dir",
        "runs_root", "save_record",
    ),
    "system.server": (
        "PeakMemory", "Server", "cpu_cores", "fit_to_server", "this_server",
    ),
    "parallel.sharding": (
        "BYTES_PER_PARAMETER", "ZERO_STAGES", "compare_ddp_fsdp", "held_bytes", "memory_ratio", "plot_held_memory",
        "shard_model", "zero_memory_table",
    ),
    "lessons.cluster_step": (
        "ClusterStep", "cluster_step",
    ),
    "lessons.slurm_jobs": (
        "binding_line", "binding_table", "config_flags", "env_check_request", "gpus_in_gres",
        "find_slurm", "gather_array", "job_table", "job_usage",
        "node_table", "partition_table", "preemption_verdict", "rank_binding", "script_lines",
    ),
    "lessons.slurm_lesson": (
        "SlurmLesson", "plot_job_timeline",
    ),
    "lessons.sweeps": (
        "Rung", "amdahl_speedup", "batch_size_sweep", "climb_ladder", "compile_wait_s", "dataloader_sweep",
        "gpt_ladder_rungs", "ladder_rungs", "rung_configs", "same_as_below", "speedup_text", "worker_counts",
    ),
    "parallel.gpt_parallel": (
        "compare_gpt_parallel", "gpt_parallel_table", "shard_gpt", "split_gpt",
    ),
    "parallel.tensor_parallel": (
        "ColumnParallelLinear", "RowParallelLinear", "check_tensor_parallel",
    ),
    "spine.text": (
        "STDLIB_MODULES", "TokenData", "TokenDeviceLoader", "TokenTorchLoader", "bits_per_byte", "first_windows",
        "load_text",
        "make_token_loader", "read_token_shards", "stdlib_corpus", "unigram_entropy", "write_token_shard",
    ),
    "system.gpu_records": (
        "GpuFigure", "check_figures", "gpt_mfu_sentence", "gpt_throughput_figures", "gpu_training_record",
        "notebook_seconds", "precision_sentence", "simplecnn_sentence",
    ),
    "spine.timing": (
        "RegionTimer", "StepTimer", "Timings", "allocation_records", "init_cuda", "native_noise_filtered",
        "peak_memory_mib", "profiler", "step_peak_mib", "time_repeats",
    ),
    "spine.trainer": (
        "InjectedFailure", "RunResult", "build_optimizer", "deterministic_kernels", "evaluate", "train",
    ),
    "spine.config": (
        "TrainConfig", "validate_config",
    ),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}
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


class _FlatAPI(types.ModuleType):
    """The package module, kept flat: importing the command ``workshop_utils.train`` (torchrun workers,
    tests) must not replace ``wu.train``, the training function, with that module."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable through sys.modules and importlib.import_module
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _FlatAPI
