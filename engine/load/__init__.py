"""The LOAD stage: the upload imported (`upload_import`), its model resolved
(`model_resolution`), its inputs and weights read (`inputs`, `weights`), a checkpoint
built (`checkpoint/`), the eager reference run (`eager`); `model` holds what the stages
hand each other.
"""
