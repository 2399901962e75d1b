"""The one error type of the policy core: a bad value, named by its path in the input."""

from __future__ import annotations


class PolicyError(ValueError):
    """A value in a quota file or decision file that the policy cannot accept.

    ``path`` locates the value (``queues[0].quotas[3].sharing``), ``message`` says what is wrong and,
    where there is a closed set, which values are allowed. ``str(error)`` is ``"path: message"`` so
    that CLIs and task logs can print it as it is.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)
