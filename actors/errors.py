"""Typed errors of the data plane: a trial fails with one of these and a message that says what to do."""

from __future__ import annotations

from importlib.util import find_spec

from sweeper.core.precisions import Precision


class PrecisionUnavailable(RuntimeError):
    """The worker lacks the library a precision needs (e.g. bitsandbytes for int8)."""

    @classmethod
    def check(cls, precision: Precision) -> None:
        """Raise unless ``precision``'s library can be imported on this worker.

        The planner cannot know (the head node is not the worker), so the
        trial's load fails with this, before any weights are written.
        """
        if precision.library and find_spec(precision.library) is None:
            raise cls(f"precision {precision.name} needs {precision.library} on this worker: "
                      f"pip install {precision.library}")


class QuantizationShapeError(ValueError):
    """A quantized kernel cannot run a layer of this model's shape on this device."""
