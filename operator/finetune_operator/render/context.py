"""What every renderer takes, as its one argument: `RenderContext` (the job, its admission, the attempt, the options).

Every renderer in this package is a function `(RenderContext) -> part` (topology, deepspeed.json, accelerate.yaml,
trainer.json, the node command, the ConfigMap, the Service, the Job), so they compose without threading values
through each other: a renderer that needs another one's part calls it (they are pure and cheap, except the files'
serialization, which `render` runs once). A context can only be built around an `Admitted` job: no renderer runs
on a job that breaks a rule or has no plan.
"""

from dataclasses import dataclass, field, replace

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.admit import Admitted
from finetune_operator.plan import Plan
from finetune_operator.policy import PodPolicy

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RenderOptions:
    """Inputs that come from where the job runs (the operator's deployment, or `ftjob run`), not from the job."""

    image: str = constants.DEFAULT_TRAINER_IMAGE
    policy: PodPolicy = field(default_factory=PodPolicy)
    """What `spec.template` may ask for (`ftjob operator` flags); admission (`admit`) refuses a job beyond it, the
    renderers never read it."""
    progress_url: str | None = None
    progress_ca: str | None = None  # PEM the trainer pins for progress_url (put in the ConfigMap)
    config_dir: str = constants.CONFIG_MOUNT
    checkpoint_dir: str = constants.CHECKPOINT_MOUNT
    main_process_host: str | None = None
    """Node 0's address in the node command; None: its DNS name through the headless Service (in a cluster)."""
    machine_rank: str = f"$({constants.ENV_COMPLETION_INDEX})"
    """The node command's machine rank: the Indexed Job's completion index, expanded by Kubernetes in a pod; a
    number for a local node."""

    @property
    def progress_ca_file(self) -> str | None:
        """Where the pod finds the CA it pins for the progress URL; None when there is none to pin."""
        if self.progress_url and self.progress_ca:
            return f"{self.config_dir}/{constants.PROGRESS_CA_FILE}"
        return None


@dataclass(frozen=True)
class RenderContext:
    """One job rendered for one attempt: the renderers' single argument."""

    job: FineTuneJob
    admitted: Admitted
    """The job's admission (`admit`): proof that it breaks no rule, and its plan."""
    attempt: int = 1
    options: RenderOptions = field(default_factory=RenderOptions)

    @property
    def plan(self) -> Plan:
        return self.admitted.plan

    def on_local_node(self, rank: int) -> "RenderContext":
        """This context for node `rank` of a run on one machine (`ftjob run`): node 0 on loopback, the rank a number."""
        return replace(self, options=replace(self.options, main_process_host=LOOPBACK, machine_rank=str(rank)))
