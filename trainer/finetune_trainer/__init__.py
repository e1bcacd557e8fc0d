"""finetune_trainer: what runs in each trainer pod under `accelerate launch` (and under `ftjob run`).

`python -m finetune_trainer --config trainer.json` reads top to bottom in `__main__.py`; each step lives in a
module with one job:

* `loading` — trainer.json → `finetune_api.trainer_input.TrainerInput` (exit 64 naming the field)
* `builtin` — `builtin:tiny-llama` / `builtin:tiny-chat`, generated locally, nothing downloaded
* `cpu` — CPU-only quirks (`use_cpu`, DeepSpeed's JIT shm op)
* `arguments` — TrainerInput → TRL `SFTConfig`, the one place our names meet TRL's (built before the model, for
  ZeRO-3 `zero.Init`)
* `model`, `quantization`, `templates` — tokenizer + chat template, base model, QLoRA (exit 66 unknown model)
* `zero3_loading` — QLoRA under ZeRO-3: each 4-bit weight partitioned as it is loaded
* `allocator` — CUDA allocator with expandable segments unless the env configures it
* `data` — dataset splits → `input_ids` (exit 65 bad dataset); TRL packs them padding-free
* `adapters` — LoRA config; merging under ZeRO-3
* `checkpoints` — completion markers, resume from the newest complete checkpoint, SIGTERM → checkpoint
* `progress` — log lines, metrics.jsonl, POSTs to the operator
* `cards`, `hub` — model card + loss plot, push with retries
* `probes` — final logits on a fixed text, for tests
* `errors` — permanent errors and their exit codes
* `launch` — the pod's command, `python -m finetune_trainer.launch -- accelerate launch ...`: a permanent error
  (exit 64/65/66) stops the worker group at once and becomes the container's exit code

It never imports kopf, kubernetes or the operator; it shares only `finetune_api` with it: the trainer input
(`finetune_api.trainer_input`, whose sections are the API's own `finetune_api.v1alpha1.spec` models), the constants,
the termination record and `finetune_api.v1alpha1.status`.
"""
