"""Rules between fields, each said once: the CEL the API server runs and the Python the operator runs.

A FineTuneJob is checked twice. The API server checks it at `kubectl apply`, with the CRD's
`x-kubernetes-validations` (CEL); the operator, `ftjob render` and `ftjob run` check it again with
`finetune_operator.validation.check_job` (Python), because a job may never meet an API server (`ftjob
render`), or may have been stored under an older CRD. A rule written twice drifts: one side gains a
case, a path or a word the other lacks. Here a rule is one entry of its object's table, both sides
together, declared in the model class beside the fields it guards:

    @rule(".offloadActivations", "<CEL over self, the object as written>", "<message>")
    def offloaded_activations_are_checkpoints(self) -> bool:
        return <the same condition over the parsed model>

`rules_of(Model)` is the table. Every API model's `json_schema_extra` is `cel_schema_extra`, which
writes the table into the model's JSON schema, so the CRD generator emits the CEL side unchanged;
`violations(job)` walks a parsed job and runs the Python side of every table it meets. Both report
at one place, the object's path plus the rule's `field` (CEL's `fieldPath`), with one message: what
`kubectl apply` says is what the job's status and `ftjob render` say.

Three kinds of entry:

- `rule`: a method of the model, True when the rule holds; CEL on the object's schema.
- `transition_rule`: compares with the stored version (CEL's `oldSelf`); the method takes the old
  model too. Only the API server sees updates, so `check_job` does not run these;
  `transition_violations(new, old)` does, for tests and for any caller that holds both versions.
- `ValueRule`: a rule on one value, placed in `Annotated[...]`; CEL on the field's own schema, and
  pydantic runs the check as it parses the value (before the type's own validation, as CEL sees the
  value as written), so the parse error carries the rule's message.

The CEL side reads the object as written, where an absent (or null) field is absent (`has()` is
false); the Python side reads the model, where it holds its default. Each CEL expression therefore
reads an absent field as its default. Pure: no I/O.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from finetune_api.v1alpha1.errors import FieldError

Reason = Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]
"""CEL's `reason`: how the API server labels a violation (`Invalid value:`, `Forbidden:`, `Required value:`)."""
M = TypeVar("M", bound=BaseModel)
_MARK = "__api_rule__"


def _validation(cel: str, message: str, field: str, reason: Reason | None) -> dict[str, str]:
    entry = {"rule": cel, "message": message}
    if field:
        entry["fieldPath"] = field
    if reason:
        entry["reason"] = reason
    return entry


@dataclass(frozen=True)
class Rule:
    """One entry of an object's table: field path, CEL expression, Python check, message, reason."""

    name: str
    """The Python check's name (the method's)."""
    field: str
    """Where a violation is reported, from the object, in wire (camelCase) form: `""` for the object itself,
    else `.a.b` (CEL's `fieldPath`)."""
    cel: str
    """The expression over `self` (and `oldSelf` for a transition rule) that the API server evaluates."""
    check: Callable[..., bool]
    """The same condition over the parsed model: `check(model)`, or `check(model, old)` for a transition rule."""
    message: str
    reason: Reason | None = None
    transition: bool = False

    def validation(self) -> dict[str, str]:
        """The CRD's `x-kubernetes-validations` entry."""
        return _validation(self.cel, self.message, self.field, self.reason)

    def path(self, at: str) -> str:
        """Where a violation of this rule on the object at `at` is reported."""
        return f"{at}{self.field}" if at else self.field.removeprefix(".")


def rule(
    field: str, cel: str, message: str, *, reason: Reason | None = None
) -> Callable[[Callable[[M], bool]], Callable[[M], bool]]:
    """Make a model method (True when the rule holds) an entry of its model's table."""

    def mark(check: Callable[[M], bool]) -> Callable[[M], bool]:
        setattr(check, _MARK, Rule(check.__name__, field, cel, check, message, reason))
        return check

    return mark


def transition_rule(
    field: str, cel: str, message: str, *, reason: Reason | None = None
) -> Callable[[Callable[[M, M], bool]], Callable[[M, M], bool]]:
    """Like `rule`, for a rule over the new and the stored version (`oldSelf`): the method takes the old model."""

    def mark(check: Callable[[M, M], bool]) -> Callable[[M, M], bool]:
        setattr(check, _MARK, Rule(check.__name__, field, cel, check, message, reason, transition=True))
        return check

    return mark


@cache
def rules_of(model: type[BaseModel]) -> tuple[Rule, ...]:
    """The table of one API object, in declaration order; a subclass's table extends its bases'."""
    found: dict[str, Rule] = {}
    for klass in reversed(model.__mro__):
        for name, value in vars(klass).items():
            entry = getattr(value, _MARK, None)
            if isinstance(entry, Rule):
                found[name] = entry
            else:
                found.pop(name, None)  # redefined without a rule
    return tuple(found.values())


def cel_schema_extra(schema: dict[str, Any], model: type[Any]) -> None:
    """`json_schema_extra` of the API models: the model's table as `x-kubernetes-validations`."""
    table = rules_of(model) if isinstance(model, type) and issubclass(model, BaseModel) else ()
    if table:
        schema["x-kubernetes-validations"] = [entry.validation() for entry in table]


@dataclass(frozen=True)
class ValueRule:
    """A rule on one value, for `Annotated[T, ValueRule(...)]`: CEL on the field's own schema, and a check of
    the value as written (before the type's own validation; True when it holds) that pydantic runs while
    parsing, so that the parse error says the rule's message at the field's path, as the API server does."""

    cel: str
    check: Callable[[Any], bool]
    message: str
    reason: Reason | None = None

    def validation(self) -> dict[str, str]:
        """The CRD's `x-kubernetes-validations` entry."""
        return _validation(self.cel, self.message, "", self.reason)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self._validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.setdefault("x-kubernetes-validations", []).append(self.validation())
        return json_schema

    def _validate(self, value: Any) -> Any:
        if not self.check(value):
            raise PydanticCustomError("api_rule", self.message)
        return value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _fields(node: BaseModel) -> list[tuple[str, Any]]:
    """(wire name, value) of each field of a model."""
    return [(info.alias or name, getattr(node, name)) for name, info in type(node).model_fields.items()]


def violations(node: object, path: str = "") -> list[FieldError]:
    """Every table entry (not transition rules) that does not hold anywhere in `node`'s tree: an object's own
    rules first, then its fields' in field order; `path` is where `node` sits (`""` for a whole job)."""
    found: list[FieldError] = []
    if isinstance(node, BaseModel):
        found += [
            FieldError(entry.path(path), entry.message)
            for entry in rules_of(type(node))
            if not entry.transition and not entry.check(node)
        ]
        for name, value in _fields(node):
            found += violations(value, _join(path, name))
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            found += violations(item, f"{path}[{i}]")
    elif isinstance(node, dict):
        for key, item in node.items():
            found += violations(item, f"{path}[{key}]")
    return found


def transition_violations(new: BaseModel, old: BaseModel, path: str = "") -> list[FieldError]:
    """Every transition rule that changing `old` into `new` breaks. Rules are followed into model fields that
    both versions hold, not into list items: the API server pairs old and new items only in keyed lists
    (`x-kubernetes-list-type: map`), and the FineTuneJob has none."""
    found = [
        FieldError(entry.path(path), entry.message)
        for entry in rules_of(type(new))
        if entry.transition and not entry.check(new, old)
    ]
    for (name, value), (_, before) in zip(_fields(new), _fields(old), strict=True):
        if isinstance(value, BaseModel) and type(before) is type(value):
            found += transition_violations(value, before, _join(path, name))
    return found
