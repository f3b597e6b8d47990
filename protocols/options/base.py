"""What every option group shares: :class:`OptionGroup` (kebab-case keys, unknown keys, NaN and booleans for numbers
refused) and the :data:`SILO` mark of a field the silos receive in their train instruction (:func:`is_silo_field`)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ValidationInfo, field_validator

from silofl.protocols.messages import STRICT_KEBAB_CONFIG

#: `json_schema_extra` of a field that the silos receive in every train instruction (:mod:`protocols.messages`).
SILO: dict[str, Any] = {"silo": True}


def is_silo_field(info: Any) -> bool:
    """Whether a field is sent to the silos in the train instruction."""
    extra = getattr(info, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("silo"))


class OptionGroup(BaseModel):
    """Base of every option group: kebab-case keys, unknown keys refused, NaN and infinity refused unless a field
    allows them (epsilon), booleans refused where a number is expected (`rounds = true` would run one round)."""

    #: The group's title in `silofl run ALG --help`.
    heading: ClassVar[str] = "options"

    model_config = STRICT_KEBAB_CONFIG

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, float):
            raise ValueError("a boolean is not a number: give the value itself")
        return value
