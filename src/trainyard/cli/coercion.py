"""Option and argument values without pydantic: Typer 0.29 coerces every value through a pydantic
validator, and building the first one imports pydantic's validator machinery, a large share of a
command's start-up. Strings, integers and floats (with their ``min``/``max``), flags and lists of those
are coerced here with the same results and the same messages; every other kind of parameter (paths,
choices, files, custom parsers, clamping) keeps Typer's own coercion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args, get_origin

from typer._click.exceptions import BadParameter
from typer._coercion import RuntimeParam, TypeDescriptor

_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class LightRuntimeParam(RuntimeParam):
    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if get_origin(self.annotation) is list:
            (item,) = get_args(self.annotation)
            values = value if isinstance(value, list | tuple) else [value]
            return [self._one(item, v, param, ctx) for v in values]
        return self._one(self.annotation, value, param, ctx)

    def _one(self, annotation: Any, value: Any, param: Any, ctx: Any) -> Any:
        if annotation is str:
            if isinstance(value, bytes):
                return value.decode()
            return value if isinstance(value, str) else str(value)
        if annotation is bool:
            if isinstance(value, bool):
                return value
            raise BadParameter("Input should be a valid boolean", ctx=ctx, param=param)
        number: int | float
        if annotation is int:
            if isinstance(value, bool):
                number = int(value)
            elif isinstance(value, int):
                number = value
            elif isinstance(value, float) and value.is_integer():
                number = int(value)
            else:
                try:
                    number = int(str(value).strip())
                except ValueError:
                    raise BadParameter(
                        "Input should be a valid integer, unable to parse string as an integer",
                        ctx=ctx,
                        param=param,
                    ) from None
        else:
            try:
                number = float(value.strip() if isinstance(value, str) else value)
            except (TypeError, ValueError):
                raise BadParameter(
                    "Input should be a valid number, unable to parse string as a number", ctx=ctx, param=param
                ) from None
        info = self.parameter_info
        if info.min is not None and number < info.min:
            raise BadParameter(
                f"Input should be greater than or equal to {_bound(info.min)}", ctx=ctx, param=param
            )
        if info.max is not None and number > info.max:
            raise BadParameter(
                f"Input should be less than or equal to {_bound(info.max)}", ctx=ctx, param=param
            )
        return number


def _bound(value: float) -> str:
    """A bound as pydantic writes it in its messages (``60``, not ``60.0``)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def light_runtime_param(descriptor: TypeDescriptor) -> LightRuntimeParam | None:
    """The pydantic-free coercion for ``descriptor``, or None where Typer's own is needed."""
    info = descriptor.parameter_info
    if descriptor.file_annotation is not None or info.parser is not None or info.clamp:
        return None
    annotation = descriptor.annotation
    scalar = annotation
    if get_origin(annotation) is list:
        args = get_args(annotation)
        if len(args) != 1:
            return None
        scalar = args[0]
    if scalar not in _SCALARS:
        return None
    return LightRuntimeParam(parameter_info=info, annotation=annotation)
