"""The reduction ops a Zen sync takes: zen_hvd.Average and zen_hvd.Sum.

Their values are Horovod's op codes, so `hvd.Average` and `hvd.Sum` pass for them where Horovod
is installed, and a script written for either runs unchanged without Horovod.
"""
Average, Sum = 0, 1
NAMES = {0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product"}


def name(code) -> str:
    """The name of a reduction op code, as Horovod spells it."""
    return NAMES.get(int(code), f"op code {int(code)}")
