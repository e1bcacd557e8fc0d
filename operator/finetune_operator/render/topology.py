"""How many machines and processes a job spans; shared by every renderer so they agree."""

from dataclasses import dataclass

from finetune_operator.render.context import RenderContext


@dataclass(frozen=True)
class Topology:
    num_machines: int
    processes_per_machine: int
    use_cpu: bool

    @property
    def num_processes(self) -> int:
        """Total processes across all machines (accelerate's `num_processes`)."""
        return self.num_machines * self.processes_per_machine


def compute_topology(ctx: RenderContext) -> Topology:
    dist = ctx.job.spec.distributed
    per_machine = dist.processes_per_node or dist.gpus_per_node
    return Topology(
        num_machines=dist.nodes, processes_per_machine=per_machine, use_cpu=dist.gpus_per_node == 0
    )
