"""On PYTHONPATH, makes Horovod (and mmh3) unimportable, as on a machine without them: the
tests that run with it prove zen_hvd does not need them."""
import sys

BLOCKED = ("horovod", "mmh3")


class _Refuse:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked here (tests/no_horovod/sitecustomize.py)")
        return None


sys.meta_path.insert(0, _Refuse)
