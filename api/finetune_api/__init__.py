"""The contract between the operator and the trainer: the one package both sides import.

`finetune_operator` (the control plane: kopf, Kubernetes clients, renderers) and `finetune_trainer` (what runs
in the pod: torch, TRL, PEFT) never import each other; everything they must agree on lives here, once:

- `finetune_api.v1alpha1`: the FineTuneJob API models (spec, status, the trainer's progress report); the CRD is
  generated from them.
- `finetune_api.constants`: names both sides use (labels, mount paths, environment variables, exit codes) and
  every `FTJOB_*` environment knob, each with a one-line docstring.
- `finetune_api.trainer_input`: the model of `trainer.json`, which the operator writes and the trainer reads.

Pure pydantic and the standard library: no I/O, no Kubernetes, no torch, so both images can install it.
"""
