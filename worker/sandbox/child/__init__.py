"""The job child: what it runs after its lockdown (`run`) and its requests to the zygote
(`requests`: round trips, toolchain commands).
"""
