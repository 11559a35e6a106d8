"""Companion package of the workshop "HPC for deep learning with PyTorch".

The notebooks, command-line entries and Slurm jobs all import from here, so there
is one data pipeline, one model zoo and one training loop. Import it flat::

    import workshop_utils as wu
    result = wu.train(wu.TrainConfig(model="simplecnn", precision="bf16"))
"""

from .checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from .data import (CLASSES, CifarData, DeviceLoader, TorchLoader, load_data, make_loader, make_synthetic_cifar,
                   read_cifar10, verify_cifar10)
from .distributed import DistInfo, all_reduce_sum, read_dist_env, setup_distributed, teardown_distributed
from .errors import WorkshopError, install_notebook_error_handler
from .flops import achieved_tflops, mfu, training_flops_per_sample
from .hardware import PEAK_TFLOPS, PRECISIONS, check_precision, environment, environment_table, peak_tflops, pick_device
from .models import MODELS, SimpleCNN, build_model, count_parameters, parameter_checksum, resnet18_cifar, unwrap
from .plots import plot_bars, plot_step_times, plot_training_curves, save_figure
from .precision import autocast, configure_precision, grad_scaler, set_tf32
from .profiles import pick_settings, resolve_profile
from .report import add_report_section, write_report
from .results import load_results, new_run_dir, read_records, resolve_run_dir, save_record
from .timing import StepTimer, peak_memory_mib
from .trainer import InjectedFailure, RunResult, TrainConfig, evaluate, train

__version__ = "0.1.0"
