"""The progress channel from the trainer to `status.progress`: an HTTPS endpoint with per-job tokens.

`auth` decides who may report for which job (TokenReview with the job's audience, then the pod's
job-name label), `ratelimit` bounds how often, `server` is the aiohttp app, `tls` makes the
serving certificate. Rejected alternatives: polling pod logs, or giving trainer pods RBAC to patch
their own job.
"""
