"""The TRACE stage: `torch.export.export` with its fallbacks (`tracing`), the full list of
issues of a failed export (`draft`) and the library settings switched before tracing
(`library_adaptations`).
"""
