"""Ensembles: step graphs checked at load and a dataflow scheduler that runs them."""
