"""Spec errors with a field path, collected all at once (Kubeflow's field.ErrorList, in Python)."""

from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True)
class FieldError:
    """One problem: where (`spec.distributed.deepspeed.offloadParams`) and what would be right."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidSpecError(ValueError):
    """A spec that can never run; carries every problem found, not just the first."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))

    @classmethod
    def from_message(cls, path: str, message: str) -> "InvalidSpecError":
        return cls([FieldError(path, message)])

    @classmethod
    def from_pydantic(cls, exc: ValidationError, *, prefix: str = "") -> "InvalidSpecError":
        """Turn pydantic's error list into field-path errors in the wire (camelCase) form."""
        errors = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
            path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
            message = err["msg"]
            if err["type"] == "extra_forbidden":
                message = "unknown field (check the spelling; fields are camelCase)"
            errors.append(FieldError(path, message))
        return cls(errors)
