"""finetune_trainer: what runs in each trainer pod under `accelerate launch` (and under `ftjob run`)."""
