"""The FineTuneJob API (v1alpha1): pydantic models of spec and status; the CRD is generated from them."""

from finetune_operator.api.errors import FieldError, InvalidSpecError
from finetune_operator.api.resource import FineTuneJob
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import FineTuneJobStatus

__all__ = ["FieldError", "FineTuneJob", "FineTuneJobSpec", "FineTuneJobStatus", "InvalidSpecError"]
