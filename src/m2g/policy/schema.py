"""Static type checking of policy expressions, with types derived from m2g.model.inputs.

The pydantic input models are turned into protobuf message descriptors at run time, and
cel-expr-python's checker compiles every expression against them: ``workload.gpus * 1.5`` (int
times double) and ``workload.gpuz`` (no such field) are errors at lint time, with a position.
Only cel-expr-python has a checker; with cel-python alone, lint checks syntax only.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import Any

from pydantic import BaseModel

from m2g.model.inputs import PolicyInput
from m2g.policy.runtime import CelCompileError, first_line

PACKAGE = "m2g.v1alpha1"


class ExpectedType(StrEnum):
    """What an expression must return, by its place in a policy."""

    BOOL = "bool"
    INT = "int"
    DOUBLE = "double"
    STRING = "string"
    ANY = "any"


def _message_name(model: type[BaseModel]) -> str:
    name = model.__name__
    return name.removesuffix("View") if name != "PolicyInput" else "Input"


@dataclass
class _Builder:
    """Accumulates message descriptors for a tree of pydantic models."""

    fdp: Any
    done: set[str]

    def message(self, model: type[BaseModel]) -> str:
        name = _message_name(model)
        if name in self.done:
            return f".{PACKAGE}.{name}"
        self.done.add(name)
        msg = self.fdp.message_type.add(name=name)
        for number, (fname, info) in enumerate(model.model_fields.items(), start=1):
            alias = info.alias or fname
            self._field(msg, alias, info.annotation, number)
        return f".{PACKAGE}.{name}"

    def _field(self, msg: Any, name: str, annotation: Any, number: int) -> None:
        from google.protobuf import descriptor_pb2

        fd = descriptor_pb2.FieldDescriptorProto
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is dict:
            entry = msg.nested_type.add(name=f"{name[0].upper()}{name[1:]}Entry")
            entry.options.map_entry = True
            self._scalar_or_message(entry, "key", args[0], 1, fd.LABEL_OPTIONAL)
            self._scalar_or_message(entry, "value", args[1], 2, fd.LABEL_OPTIONAL)
            msg.field.add(
                name=name, number=number, label=fd.LABEL_REPEATED, type=fd.TYPE_MESSAGE,
                type_name=f".{PACKAGE}.{msg.name}.{entry.name}",
            )
        elif origin in (tuple, list):
            self._scalar_or_message(msg, name, args[0], number, fd.LABEL_REPEATED)
        else:
            self._scalar_or_message(msg, name, annotation, number, fd.LABEL_OPTIONAL)

    def _scalar_or_message(self, msg: Any, name: str, tp: Any, number: int, label: int) -> None:
        from google.protobuf import descriptor_pb2

        fd = descriptor_pb2.FieldDescriptorProto
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            msg.field.add(name=name, number=number, label=label, type=fd.TYPE_MESSAGE,
                          type_name=self.message(tp))
            return
        if isinstance(tp, type) and issubclass(tp, datetime):
            msg.field.add(name=name, number=number, label=label, type=fd.TYPE_MESSAGE,
                          type_name=".google.protobuf.Timestamp")
            return
        scalar = _SCALARS.get(_base_type(tp))
        if scalar is None:
            raise TypeError(f"no CEL type for {tp!r} (field {name})")
        msg.field.add(name=name, number=number, label=label, type=getattr(fd, scalar))


_SCALARS = {bool: "TYPE_BOOL", int: "TYPE_INT64", float: "TYPE_DOUBLE", str: "TYPE_STRING"}


def _base_type(tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, Enum):
        return str
    if isinstance(tp, types.UnionType):
        return _base_type(next(a for a in typing.get_args(tp) if a is not type(None)))
    return tp


class TypeChecker:
    """Compiles expressions in a typed cel-expr-python environment; reports type errors."""

    def __init__(self) -> None:
        from cel_expr_python import cel
        from google.protobuf import (
            descriptor_pb2,
            descriptor_pool,
            duration_pb2,
            struct_pb2,
            timestamp_pb2,
        )

        self._cel = cel
        self._pool = descriptor_pool.DescriptorPool()
        for mod in (timestamp_pb2, duration_pb2, struct_pb2):
            self._pool.Add(descriptor_pb2.FileDescriptorProto.FromString(mod.DESCRIPTOR.serialized_pb))
        fdp = descriptor_pb2.FileDescriptorProto(
            name="m2g/v1alpha1/inputs.proto", package=PACKAGE, syntax="proto3",
            dependency=["google/protobuf/timestamp.proto"],
        )
        builder = _Builder(fdp, set())
        self._vars: dict[str, Any] = {}
        for fname, info in PolicyInput.model_fields.items():
            ann = info.annotation
            if typing.get_origin(ann) is dict:
                value_type = typing.get_args(ann)[1]
                self._vars[fname] = cel.Type.Map(
                    cel.Type.STRING, cel.Type(builder.message(value_type).lstrip("."))
                )
            elif ann is datetime:
                self._vars[fname] = cel.Type.TIMESTAMP
            else:
                assert isinstance(ann, type) and issubclass(ann, BaseModel)
                self._vars[fname] = cel.Type(builder.message(ann).lstrip("."))
        self._pool.Add(fdp)
        self._counter = 0
        self.base_env = self.env_with_variables({})

    def env_with_variables(self, variables: dict[str, Any]) -> Any:
        """A typed environment in which ``variables.<name>`` has the given CEL types."""
        from google.protobuf import descriptor_pb2

        decls = dict(self._vars)
        if variables:
            self._counter += 1
            name = f"Vars{self._counter}"
            fdp = descriptor_pb2.FileDescriptorProto(
                name=f"m2g/v1alpha1/vars{self._counter}.proto", package=f"{PACKAGE}.vars",
                syntax="proto3", dependency=["google/protobuf/struct.proto",
                                             "google/protobuf/timestamp.proto",
                                             "google/protobuf/duration.proto",
                                             "m2g/v1alpha1/inputs.proto"],
            )
            msg = fdp.message_type.add(name=name)
            for number, (vname, vtype) in enumerate(variables.items(), start=1):
                self._var_field(msg, vname, vtype, number)
            self._pool.Add(fdp)
            decls["variables"] = self._cel.Type(f"{PACKAGE}.vars.{name}")
        else:
            decls["variables"] = self._cel.Type.Map(self._cel.Type.STRING, self._cel.Type.DYN)
        return self._cel.NewEnv(descriptor_pool=self._pool, variables=decls)

    def _var_field(self, msg: Any, name: str, cel_type: Any, number: int) -> None:
        from google.protobuf import descriptor_pb2

        fd = descriptor_pb2.FieldDescriptorProto
        t = self._cel.Type
        scalars = {"BOOL": fd.TYPE_BOOL, "INT": fd.TYPE_INT64, "DOUBLE": fd.TYPE_DOUBLE,
                   "STRING": fd.TYPE_STRING}
        for key, proto_type in scalars.items():
            if cel_type == getattr(t, key):
                msg.field.add(name=name, number=number, label=fd.LABEL_OPTIONAL, type=proto_type)
                return
        if cel_type == t.TIMESTAMP:
            type_name = ".google.protobuf.Timestamp"
        elif cel_type == t.DURATION:
            type_name = ".google.protobuf.Duration"
        elif cel_type.is_message():
            type_name = f".{cel_type.name()}"
        else:
            type_name = ".google.protobuf.Value"  # lists, maps, dyn: checked as dyn
        msg.field.add(name=name, number=number, label=fd.LABEL_OPTIONAL, type=fd.TYPE_MESSAGE,
                      type_name=type_name)

    def check(self, env: Any, source: str, expected: ExpectedType) -> Any:
        """Type-check ``source``; return its CEL type or raise CelCompileError."""
        try:
            expr = env.compile(source)
        except Exception as exc:
            raise CelCompileError(first_line(str(exc))) from None
        rtype = expr.return_type()
        if expected is not ExpectedType.ANY and not self._accepts(expected, rtype):
            raise CelCompileError(
                f"must return {expected.value}, but returns {_type_name(rtype)}"
            )
        return rtype

    def _accepts(self, expected: ExpectedType, rtype: Any) -> bool:
        t = self._cel.Type
        if rtype == t.DYN or (expected is ExpectedType.DOUBLE and rtype == t.INT):
            return True
        want = {ExpectedType.BOOL: t.BOOL, ExpectedType.INT: t.INT,
                ExpectedType.DOUBLE: t.DOUBLE, ExpectedType.STRING: t.STRING}[expected]
        return bool(rtype == want)


def _type_name(rtype: Any) -> str:
    try:
        return str(rtype.name()).lower()
    except Exception:  # pragma: no cover - defensive
        return str(rtype)


def make_checker() -> TypeChecker | None:
    """A checker when cel-expr-python and protobuf import; None otherwise (syntax-only lint)."""
    try:
        return TypeChecker()
    except ImportError:
        return None
