"""Dynamic shapes: the contract's JSON grammar to torch (`grammar`) and back (`json_form`),
the spec's structure against the inputs (`structure`), proposals from the example inputs
(`examples`), the user's dim names (`dim_names`) and sampled inputs inside a program's
ranges (`sampling`).
"""
