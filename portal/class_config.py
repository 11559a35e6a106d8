"""A class on the portal: what each attendee's server gets, and what every attendee's environment holds.

Load it after the kit's recipe, from the site's own configuration (docs/portal.md walks through a class of 30):

    load_subconfig("/path/to/checkout/portal/jupyterhub_config.py")
    load_subconfig("/path/to/checkout/portal/class_config.py")

then set the figures below for your class. The kit's notebooks read what a server was given (its cgroup's
CPU quota and memory limit, and JupyterHub's CPU_LIMIT and MEM_LIMIT) and size themselves to it; a server
below what a notebook needs is told so in one line at the notebook's start. ``make classroom`` loads this
file too: the figures here are the ones its record was measured with.
"""

c = get_config()  # noqa: F821 - defined by JupyterHub when it reads this file

# Per attendee. A spawner that enforces limits turns these into a cgroup's quota and limit: SystemdSpawner
# (CPUQuota, MemoryMax), KubeSpawner (the pod's limits), batchspawner's SlurmSpawner (--cpus-per-task, --mem:
# set req_nprocs and req_memory there). The kit's cpu profile runs in 1 core and 3 GiB (results/reference/classroom/).
c.Spawner.cpu_limit = 2
c.Spawner.mem_limit = "4G"

# GPUs, per attendee or per few: the spawner's own setting, e.g.
#   KubeSpawner:  c.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}   (or a MIG profile's resource)
#   SlurmSpawner: c.SlurmSpawner.req_options = "--gpus=1"
#   SystemdSpawner on a shared GPU node: c.Spawner.environment["CUDA_VISIBLE_DEVICES"] = ... per user (a
#   pre_spawn_hook that hands out the node's GPUs or MIG slices in turn).

# Every attendee's environment, set once here instead of thirty times by hand:
c.Spawner.environment.update({
    # Run folders: each attendee's own (the default is runs/ beside their copy of the notebooks, else
    # ~/workshop-runs); a site with a scratch file system points them there:
    #   "WORKSHOP_RUNS": lambda spawner: f"/scratch/{spawner.user.name}/workshop-runs",
    # CIFAR-10, fetched once by the instructor and read by everyone (docs/data.md):
    #   "WORKSHOP_DATA": "/shared/workshop/data",
    # Notebook 06's jobs: the class's account and partition, for every sbatch an attendee runs:
    #   "SBATCH_ACCOUNT": "workshop", "SBATCH_PARTITION": "gpu", "SALLOC_ACCOUNT": "workshop",
    #   "SALLOC_PARTITION": "gpu", "SLURM_ACCOUNT": "workshop",
})
