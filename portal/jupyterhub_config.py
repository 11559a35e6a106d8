"""What a workshop portal's JupyterHub needs for this kit (docs/portal.md).

Load it from the site's own configuration, which keeps what is the site's: how users log in (its
authenticator) and where their servers run (batchspawner's SlurmSpawner on a cluster):

    load_subconfig("/path/to/checkout/portal/jupyterhub_config.py")

tests/test_portal.py does exactly that, adding a test login and servers started as local processes.
"""

import os

c = get_config()  # noqa: F821 - defined by JupyterHub when it reads this file
HERE = os.path.dirname(os.path.abspath(__file__))

# JupyterHub's proxy, configurable-http-proxy, as pinned in this folder (npm ci --prefix portal). A hub whose
# environment already has one on its PATH may drop this line.
c.ConfigurableHTTPProxy.command = [os.path.join(HERE, "node_modules", ".bin", "configurable-http-proxy")]

c.Spawner.default_url = "/lab"
c.Spawner.args = [
    # New notebooks start in the kit's kernel, registered for all users in the servers' environment with
    #   python -m ipykernel install --prefix <that environment> --name hpc-dl-workshop --display-name "HPC DL workshop"
    "--MultiKernelManager.default_kernel_name=hpc-dl-workshop",
    # JupyterLab's settings for a workshop (overrides.json beside this file): copy the file to
    # <that environment>/share/jupyter/lab/settings/overrides.json, or point the servers at this folder:
    f"--LabApp.app_settings_dir={os.path.join(HERE, 'lab-settings')}",
]
