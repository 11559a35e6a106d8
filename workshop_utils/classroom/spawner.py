"""The class's spawner: JupyterHub's LocalProcessSpawner, each server started inside its attendee's cgroup.

It stands in for what a site runs (SystemdSpawner, KubeSpawner, batchspawner's SlurmSpawner), which enforce
``cpu_limit`` and ``mem_limit``: the cgroups are the class's (``cgroups.Cgroups``), made before the servers
start; the server joins them between fork and exec, so the kernels and launches it starts are inside too.
JupyterHub imports this module in the hub's process (``c.JupyterHub.spawner_class``).
"""

from __future__ import annotations

import os

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, List, Unicode


class CgroupSpawner(LocalProcessSpawner):
    """A local server per attendee, in ``<cgroup_parents>/<user name>``, as that Unix user or as the hub's own."""

    cgroup_parents = List(Unicode(), config=True, help="the class's cgroup folders, one per controller")
    one_user = Bool(False, config=True, help="run every server as the hub's user, each with its own home")
    home_dir_template = Unicode("/tmp/{username}", config=True, help="the home of each server when one_user")

    def _home(self) -> str:
        return self.home_dir_template.format(username=self.user.name)

    def make_preexec_fn(self, name):
        joins = [os.path.join(parent, name, "cgroup.procs") for parent in self.cgroup_parents]
        become = None if self.one_user else super().make_preexec_fn(name)
        home = self._home()

        def preexec():
            for procs in joins:  # as root, before the user is changed: a server outside its cgroup must not start
                with open(procs, "w") as file:
                    file.write(str(os.getpid()))
            if become is not None:
                become()
            else:
                os.chdir(home)

        return preexec

    def user_env(self, env):
        if not self.one_user:
            return super().user_env(env)
        env.update(USER=self.user.name, HOME=self._home(), SHELL="/bin/bash")
        return env
