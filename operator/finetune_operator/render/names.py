"""Every child name, label set and DNS name of a job. One answer to "what is X called"."""

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob


def config_map_name(job: FineTuneJob) -> str:
    return f"{job.name}-config"


def service_name(job: FineTuneJob) -> str:
    """The headless Service; also the pods' subdomain."""
    return job.name


def attempt_job_name(job: FineTuneJob, attempt: int) -> str:
    return attempt_job_name_of(job.name, attempt)


def attempt_job_name_of(job_name: str, attempt: int) -> str:
    """The attempt Job's name from the job's name alone (the progress endpoint has no FineTuneJob object)."""
    return f"{job_name}-{attempt}"


def pod_hostname(job: FineTuneJob, attempt: int, index: int) -> str:
    """Indexed Job pods get the hostname `<job name>-<index>`."""
    return f"{attempt_job_name(job, attempt)}-{index}"


def main_process_host(job: FineTuneJob, attempt: int) -> str:
    """Node 0's stable DNS name through the headless Service."""
    return f"{pod_hostname(job, attempt, 0)}.{service_name(job)}.{job.namespace}.svc"


def job_labels(job: FineTuneJob) -> dict[str, str]:
    """Labels on every child; the operator indexes children by the job-name label."""
    return {constants.LABEL_JOB_NAME: job.name, constants.LABEL_MANAGED_BY: constants.MANAGED_BY}


def attempt_labels(job: FineTuneJob, attempt: int) -> dict[str, str]:
    return {**job_labels(job), constants.LABEL_ATTEMPT: str(attempt)}


def progress_audience(job: FineTuneJob) -> str:
    """The projected token's audience: names the job, so one job's token is useless for another."""
    return f"{constants.GROUP}/progress/{job.namespace}/{job.name}"
