"""The torchport HTTP API (FastAPI) and what it owns: jobs in the database, the artifact store.

Importing this package imports nothing heavy: the app is built by `service.app.create_app()`.
The API never imports torch and never unpickles anything; it stores and streams bytes.
"""
