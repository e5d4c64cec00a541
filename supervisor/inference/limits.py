"""Per-request bounds both frontends apply before anything is allocated from a client's counts. Triton
itself caps neither the number of tensors nor their rank (it checks them against the model config); these
only keep one request from costing unbounded parsing work, the same over HTTP and gRPC."""

MAX_TENSORS = 1024  # inputs, and requested outputs, per request
MAX_PARAMETERS = 256  # request parameters
MAX_DIMS = 64  # dimensions of one tensor (HTTP: also the deepest JSON `data` nesting accepted)
