"""The torchport HTTP API (FastAPI): routes, uploads, auth, rate limits, listings, the web
pages. The job records, the artifact store and the queue it works on belong to
`persistence`, which the workers share.

Importing this package imports nothing heavy: the app is built by `service.app.create_app()`.
The API never imports torch and never unpickles anything; it stores and streams bytes.
"""
