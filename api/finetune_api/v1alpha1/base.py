"""The base model every API object shares: camelCase on the wire, snake_case in Python, no typos."""

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """camelCase aliases, `extra="forbid"` so a misspelt field is an error rather than silently ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=False,
    )

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """The wire form: camelCase keys, JSON types."""
        return self.model_dump(by_alias=True, mode="json", **kwargs)


def cel(rule: str, message: str, *, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; kept beside the field it guards."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def with_cel_rules(*rules: dict[str, str]) -> ConfigDict:
    """ApiModel's config plus object-level CEL rules (cross-field rules live on the object they span)."""
    extra: dict[str, Any] = {"x-kubernetes-validations": list(rules)}
    return ConfigDict(**ApiModel.model_config, json_schema_extra=extra)
