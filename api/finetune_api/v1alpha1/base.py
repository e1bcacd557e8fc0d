"""The base model every API object shares: camelCase on the wire, snake_case in Python, no typos, and the
object's rule table (`finetune_api.v1alpha1.rules`) in its JSON schema as the CRD's CEL rules."""

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from finetune_api.v1alpha1.rules import cel_schema_extra


class ApiModel(BaseModel):
    """camelCase aliases, `extra="forbid"` so a misspelt field is an error rather than silently ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=False,
        json_schema_extra=cel_schema_extra,
    )

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """The wire form: camelCase keys, JSON types."""
        return self.model_dump(by_alias=True, mode="json", **kwargs)
