"""Helper imported by helper_module/1/model.py (lives in the model directory)."""


def describe(x):
    if x.size == 0:
        return "n=0"
    return f"n={x.size} min={float(x.min()):g} max={float(x.max()):g}"
