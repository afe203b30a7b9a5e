"""What the API and the workers share: job records (models, migrations, lifecycle), the
artifact store, the queue, job notices and the common settings. Imports no web code and
no torch; `service` (HTTP) and `worker` both build on it.
"""
