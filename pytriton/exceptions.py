"""The exceptions a PyTriton user catches, under the same names."""


class MessageError(Exception):
    """An exception with PyTriton's `message` property (the server-side and the client hierarchies)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        return self._message


class PyTritonError(MessageError):
    """Base class of the server-side API's errors."""


class PyTritonValidationError(PyTritonError):
    """Invalid data returned by, or given to, an inference callable."""


class PyTritonInvalidOperationError(PyTritonError):
    """An operation not allowed in the current state (e.g. bind after run)."""


class PyTritonBadParameterError(PyTritonError):
    """A wrong parameter value."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration that cannot be served."""


class PyTritonUnrecoverableError(PyTritonError):
    """The server failed in a way it cannot recover from."""


class PyTritonRuntimeError(PyTritonError):
    """Something went wrong while serving."""
