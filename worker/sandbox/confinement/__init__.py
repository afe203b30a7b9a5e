"""What confines a job, and how the worker finds out which layers the host allows: the
lockdown in order (`lockdown`: rlimits, uid, no_new_privs, Landlock, seccomp), each
layer's module, bubblewrap's command line, the private mount view, cgroups, GPU access,
and the programs a target may execute (`converters`).
"""
