"""The client exceptions a PyTriton user catches, under the same names."""


from ..exceptions import MessageError


class PyTritonClientError(MessageError):
    """Base class of the client's errors (apart from the server-side ones, as in PyTriton)."""


class PyTritonClientValueError(PyTritonClientError):
    """A wrong value given to the client."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """A server URL the client cannot use."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """The server, the model or an inference did not answer in time."""


class PyTritonClientModelUnavailableError(PyTritonClientError):
    """The model is not (or no longer) available on the server."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was used after close()."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """infer_batch() on a model without batching."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The server answered the inference with an error."""


class PyTritonClientQueueFullError(PyTritonClientError):
    """FuturesModelClient: no room left in the request queue."""
