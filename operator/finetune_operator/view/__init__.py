"""The live view of a FineTuneJob: `ftjob status`, `ftjob watch`, `ftjob logs`.

Three rooms, so that what a person reads can be tested without a cluster:

* `screen` - pure: the progress bar, the sparkline, the status screen and the one-line summary, drawn from a
  FineTuneJob body (the API's JSON) and its events;
* `pods` - pure: which pod is rank 0 of the current attempt, which events belong to the job;
* `client` - the Kubernetes side (kubeconfig resolved like kubectl, GET, watch, log streams) and the three
  commands; `flags` holds their shared command-line flags, so `ftjob --help` loads no Kubernetes client.
"""
