"""The FineTuneJob resource as a whole: metadata + spec + status."""

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from finetune_api import constants
from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.rules import rule
from finetune_api.v1alpha1.spec import FineTuneJobSpec
from finetune_api.v1alpha1.status import FineTuneJobStatus


class ObjectMeta(BaseModel):
    """The part of metadata the operator reads; everything else is kept as is."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1, max_length=253)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class FineTuneJob(BaseModel):
    """A FineTuneJob object as the operator and the CLI see it."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    api_version: str = Field(default=constants.API_VERSION, alias="apiVersion")
    kind: str = constants.KIND
    metadata: ObjectMeta
    spec: FineTuneJobSpec
    status: FineTuneJobStatus = Field(default_factory=FineTuneJobStatus)

    @rule(
        ".metadata.name",
        f"size(self.metadata.name) <= {constants.JOB_NAME_MAX}",
        f"metadata.name must be at most {constants.JOB_NAME_MAX} characters so every child's name stays a valid "
        "DNS label",
    )
    def name_leaves_room_for_children(self) -> bool:
        return len(self.metadata.name) <= constants.JOB_NAME_MAX

    @classmethod
    def from_body(cls, body: Any) -> Self:
        """Parse a manifest or a kopf body; raise InvalidSpecError with field paths on bad input."""
        data = dict(body)
        if data.get("kind", constants.KIND) != constants.KIND:
            raise InvalidSpecError.from_message(
                "kind", f"expected {constants.KIND}, got {data.get('kind')!r}"
            )
        if data.get("apiVersion", constants.API_VERSION) != constants.API_VERSION:
            raise InvalidSpecError.from_message(
                "apiVersion", f"expected {constants.API_VERSION}, got {data.get('apiVersion')!r}"
            )
        data.pop("status", None)  # status is the operator's; a malformed one must not block reconciling
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidSpecError.from_pydantic(exc) from None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace
