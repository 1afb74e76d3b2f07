"""Query logic written once for threads and for event loops: a step function is a generator that yields the
dependency calls it needs (``(target, method, args, kwargs)``) and gets their results back (or their exception,
thrown in at the ``yield``). ``run`` makes the calls on this thread; ``run_async`` awaits the target's
``<method>_async`` where it has one (the lean Redis client's adapters) and calls the plain method otherwise."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")
Call = tuple[Any, str, tuple[Any, ...], dict[str, Any]]
Steps = Generator[Call, Any, T]


def call(target: Any, method: str, *args: Any, **kwargs: Any) -> Call:
    return (target, method, args, kwargs)


def run(steps: Steps[T]) -> T:
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            target, method, args, kwargs = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value
        try:
            result, error = getattr(target, method)(*args, **kwargs), None
        except Exception as e:  # thrown into the step function, where its own handlers catch what they expect
            result, error = None, e


async def run_async(steps: Steps[T]) -> T:
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            target, method, args, kwargs = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value
        try:
            on_loop = getattr(target, method + "_async", None)
            if on_loop is not None:
                result, error = await on_loop(*args, **kwargs), None
            else:
                result, error = getattr(target, method)(*args, **kwargs), None
        except Exception as e:  # thrown into the step function, where its own handlers catch what they expect
            result, error = None, e
