"""The progress channel from the trainer to `status.progress`: an HTTPS endpoint with per-job tokens.

`auth` decides who may report for which job (cheap checks of the token's own claims in `claims`, rate
limits, then a TokenReview with the job's audience and the pod's owner chain up to the job's current
attempt), `directory` is what it knows of each job, `ratelimit` the token buckets, `validate` what a
report may say about the job's output, `reasons` every answer's code, `server` the aiohttp app,
`serving` the connection limits and deadlines it is served with, and `tls` the serving certificate.
Rejected alternatives: polling pod logs, or giving trainer pods RBAC to patch their own job.
"""
