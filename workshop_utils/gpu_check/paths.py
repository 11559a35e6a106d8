"""The GPU check's list of paths, in the order they run, each naming the CUDA branches it runs.

``tests/test_gpu_check.py`` reads every CUDA branch of the package from its source and holds each to
a path's ``covers`` here or to ``ELSEWHERE``: a new GPU-only branch without a path fails there.
"""

from __future__ import annotations

from .checks import (check_attention_kernel, check_checkpoint_resume, check_compile, check_cuda_events,
                     check_cuda_graphs, check_evaluation_memory, check_fused_adamw, check_grad_scaler, check_loaders,
                     check_fp8_matmul, check_nvml_monitor, check_peak_memory, check_precisions, check_profiler,
                     check_tensorboard)
from .context import GpuPath
from .one_rank import one_rank_paths
from .workloads import (check_ddp_lab, check_ddp_nccl, check_gpt_throughput, check_gpu_topology, check_notebook_01,
                        check_notebook_03, check_notebook_04, check_notebook_05, two_gpu_demo)

_TRAIN = ("spine.trainer:TrainingRun", "spine.trainer:_to_host_async", "spine.losses:evaluate",
          "spine.precision:configure_precision", "spine.precision:autocast", "spine.precision:grad_scaler",
          "spine.checkpoint:rng_state", "system.hardware:check_precision", "system.hardware:device_name",
          "system.hardware:pick_device", "spine.distributed:setup_distributed", "spine.distributed:rank_device",
          "spine.distributed:all_reduce_sum", "spine.timing:StepTimer", "spine.timing:_mark",
          "spine.timing:_synchronize")

PATHS: tuple[GpuPath, ...] = (
    GpuPath("cuda-events", "CUDA-event timing (time_repeats, RegionTimer) against the synchronized host clock",
            ("spine.timing:_mark", "spine.timing:_seconds", "spine.timing:_synchronize", "spine.timing:time_repeats",
             "spine.timing:RegionTimer"), check_cuda_events),
    GpuPath("peak-memory", "the allocator's peak and in-use readings; an out-of-memory error recognised and released",
            ("spine.timing:peak_memory_mib", "spine.timing:memory_in_use_mib", "spine.timing:reset_peak_memory",
             "spine.timing:init_cuda", "lessons.monitor:StepMemory", "lessons.monitor:release_failed_run",
             "lessons.monitor:is_out_of_memory"), check_peak_memory),
    GpuPath("precision-modes", "fp32 (TF32 off), tf32, fp16 with GradScaler and bf16 through the training loop",
            (*_TRAIN, "spine.precision:set_tf32", "system.hardware:peak_tflops", "system.hardware:environment",
             "system.hardware:_gpu_facts", "system.hardware:_nccl_version", "system.hardware:_driver_version"),
            check_precisions, least_s=15),
    GpuPath("grad-scaler", "notebook 03's GradScaler trace in fp16", ("lessons.numerics:grad_scaler_trace",),
            check_grad_scaler),
    GpuPath("attention-kernel", "scaled_dot_product_attention names the kernel it ran (flash in bf16)",
            ("lessons.profiling:attention_kernels",), check_attention_kernel),
    GpuPath("fused-optimizers", "fused AdamW (the GPT) and fused SGD", ("spine.trainer:build_optimizer",),
            check_fused_adamw, least_s=10),
    GpuPath("device-loaders", "the device-resident image and token loaders; the DataLoader with pinned memory",
            ("spine.data:DeviceLoader", "spine.data:build_dataloader", "spine.text:TokenDeviceLoader",
             "spine.text:make_token_loader"), check_loaders, least_s=10),
    GpuPath("gpt-evaluation", "the GPT's evaluation in chunks, its peak apart from training's",
            ("spine.losses:evaluation_chunks",), check_evaluation_memory, least_s=10),
    GpuPath("checkpoint-resume", "a checkpoint written on the GPU and resumed: the same weights as uninterrupted",
            ("spine.checkpoint:rng_state", "spine.checkpoint:set_rng_state", "spine.trainer:deterministic_kernels"),
            check_checkpoint_resume, least_s=10),
    GpuPath("nvml-monitor", "the NVML monitor samples the GPU while it trains",
            ("lessons.monitor:_nvml_handle", "lessons.monitor:DeviceMonitor", "system.hardware:mig_uuid"),
            check_nvml_monitor),
    GpuPath("tensorboard-gpu-scalar", "TensorBoard scalars, the GPU-utilisation one included",
            ("spine.scalar_log:ScalarLog",), check_tensorboard),
    GpuPath("profiler-cuda-nvtx", "torch.profiler with CUDA activity; the step phases as NVTX ranges",
            ("lessons.profiling:profile_training", "lessons.profiling:top_ops", "lessons.profiling:step_breakdown",
             "lessons.profiling:tensor_memory_by_step", "spine.timing:allocation_records", "lessons.profiling:nsys_missing",
             "spine.timing:phase_ranges"),
            check_profiler, least_s=10),
    GpuPath("torch-compile", "torch.compile of the GPT", ("spine.trainer:TrainingRun",), check_compile, least_s=30),
    GpuPath("cuda-graphs", "the ladder's CUDA-graphs rung (compile mode reduce-overhead), replays counted",
            ("spine.trainer:TrainingRun", "lessons.profiling:profile_training", "lessons.profiling:step_breakdown"),
            check_cuda_graphs, least_s=30),
    GpuPath("gpt-throughput", "benchmarks/gpt_throughput.py: GPT-2 small, sequence 1024, bf16, compiled: "
            "tokens/s and MFU", ("system.benchmark:start_benchmark",), check_gpt_throughput, least_s=60),
    GpuPath("notebook-01", "notebook 01's gpu-profile runs at a few steps: SimpleCNN, ResNet-18, GPT-2 small",
            ("spine.data:build_dataloader",), check_notebook_01, least_s=20),
    GpuPath("notebook-03", "notebook 03's gpu-profile modes at a few steps: ResNet-18 channels_last and GPT-2 small "
            "in all four; fp8 support", ("lessons.numerics:fp8_support",),
            check_notebook_03, least_s=30),
    GpuPath("notebook-04", "notebook 04's loader sweep with pinned memory and the GPT ladder, compile rung included",
            ("lessons.sweeps:dataloader_sweep", "lessons.sweeps:gpt_ladder_rungs"), check_notebook_04, least_s=60),
    GpuPath("notebook-05", "notebook 05's one-GPU part: activation checkpointing, MLP stack and GPT-2 small",
            ("spine.timing:step_peak_mib", "lessons.recompute:measure_gpt_recompute"), check_notebook_05,
            least_s=15),
    GpuPath("gpu-topology", "notebook 06: each GPU's NUMA node, and whether torchrun can bind ranks to it",
            ("lessons.slurm_binding:gpu_numa", "lessons.slurm_binding:numa_binding_problem"), check_gpu_topology,
            least_s=1),
    GpuPath("fp8-matmul", "notebook 03's fp8 matrix multiply (torch._scaled_mm) against bf16, where the GPU has fp8",
            ("lessons.numerics:check_fp8", "lessons.numerics:fp8_matmul_benchmark"), check_fp8_matmul),
    # The two-GPU paths' code on one GPU, each part in a process group of one (one_rank.py says what that cannot show).
    *one_rank_paths(),
    GpuPath("ddp-nccl", "DDP over NCCL through the training command", ("parallel.launch:launch_training",
            "parallel.launch:check_process_count", "spine.distributed:barrier", "spine.distributed:collective_device",
            "spine.distributed:teardown_distributed"), check_ddp_nccl, gpus=2),
    GpuPath("fsdp2", "FSDP2 and ZeRO against DDP (notebook 05)", ("parallel.sharding:compare_ddp_fsdp",),
            two_gpu_demo("fsdp", steps=4, batch_size=32, train_size=256), gpus=2),
    GpuPath("tensor-parallel", "the GPT's tensor-parallel plan and FSDP2 per block (notebook 05)",
            ("parallel.gpt_parallel:compare_gpt_parallel",),
            two_gpu_demo("gpt-parallel", size="tiny", steps=2, batch=4, sequence=64), gpus=2),
    GpuPath("ddp-overlap", "how much of DDP's all-reduce the backward pass hides (notebook 02)",
            ("parallel.overlap:measure_overlap", "parallel.overlap:_trace_one_backward"),
            two_gpu_demo("ddp-overlap", repeats=3), gpus=2),
    GpuPath("collectives", "notebook 05's collectives timed over NCCL",
            ("parallel.collectives:time_collectives",), two_gpu_demo("collectives-time", max_mib=16, repeats=3),
            gpus=2),
    GpuPath("distributed-checkpoint", "notebook 05's sharded and asynchronous checkpoints on GPUs",
            ("parallel.dist_checkpoint:checkpoint_stall", "parallel.dist_checkpoint:sharded_round_trip",
             "parallel.dist_checkpoint:_device"), two_gpu_demo("checkpoint", round_trip_steps=2,
                                                                         stall_steps=4, every=2), gpus=2),
    GpuPath("ddp-lab", "notebook 02's DDP lab on GPUs, one per rank (2 + 1 ranks as two nodes)", ("exercises.ddp_lab:lab_device",
            "exercises.ddp_lab:_crash", "exercises.ddp_lab:_gradients", "exercises.ddp_lab:_probe",
            "exercises.ddp_lab:_backend_of"), check_ddp_lab, gpus=3),
)

# CUDA branches that no path above runs, and why (tests/test_gpu_check.py holds every branch to one or the other).
ELSEWHERE = {
    "system.profiles:profile_choice": "which profile 'auto' means: read by every notebook and benchmark on a GPU "
                                      "node (the gpt-throughput path asks for 'gpu' explicitly)",
    "exercises.fp16_checks:check_amp_step": "names torch.cuda.amp.autocast only in a message; the check runs "
                                            "autocast on the device it is given, one code path for every device",
    "exercises.tflops_checks:_exercise_n": "Exercise 1.2's matrix size by device type (4096 on a GPU): a constant "
                                           "chosen, no GPU work",
}
