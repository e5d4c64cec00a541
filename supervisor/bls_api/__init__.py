"""The frontend that workers call: Python models' BLS requests and model-control calls (`service.py`), on each
worker's `<identity>/bls` socket, served over the data plane as a client's requests are."""
