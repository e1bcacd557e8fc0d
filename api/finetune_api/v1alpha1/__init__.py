"""The FineTuneJob API (v1alpha1): pydantic models of spec and status; the CRD is generated from them."""

from finetune_api.v1alpha1.errors import FieldError, InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.spec import FineTuneJobSpec
from finetune_api.v1alpha1.status import FineTuneJobStatus

__all__ = ["FieldError", "FineTuneJob", "FineTuneJobSpec", "FineTuneJobStatus", "InvalidSpecError"]
