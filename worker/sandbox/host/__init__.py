"""The trusted side, in the worker process (it holds the secrets; it never imports torch or
the zygote's side): the runner and its zygote client, staging, supervision (time,
memory, disk, cancel), reading a job's pipes and outputs as untrusted data, the result,
and what a job is lent and given back (slots, cgroups, its process tree).
"""
