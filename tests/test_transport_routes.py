"""Which route the device data path's buffers take through a transport (mpi/transport.py,
mpi/mpi4py_transport.py), and pull_joined's joining of messages on numpy and on tensors alike.
The routes themselves run in real syncs in test_sync_multirank.py."""
import shutil
import subprocess

import numpy as np
import pytest
import torch

from zen_hvd.mpi import mpi4py_transport
from zen_hvd.mpi.transport import Transport, joined


def test_cpu_buffers_take_the_device_route_only_when_asked(monkeypatch):
    monkeypatch.delenv("ZEN_HVD_DEVICE_BUFFERS", raising=False)
    assert not Transport(0, 2).moves_device_memory(torch.device("cpu"))
    monkeypatch.setenv("ZEN_HVD_DEVICE_BUFFERS", "1")
    t = Transport(0, 2)
    assert t.moves_device_memory(torch.device("cpu"))
    assert not t.moves_device_memory(torch.device("cuda"))   # the base class cannot move CUDA memory


def test_cuda_aware_mpi_is_the_variable_when_set(monkeypatch):
    from mpi4py import MPI

    for value, want in (("1", True), ("0", False)):
        monkeypatch.setenv("ZEN_HVD_CUDA_AWARE_MPI", value)
        assert mpi4py_transport.cuda_aware(MPI) is want
    monkeypatch.setenv("ZEN_HVD_CUDA_AWARE_MPI", "yes")
    with pytest.raises(ValueError, match="ZEN_HVD_CUDA_AWARE_MPI"):
        mpi4py_transport.cuda_aware(MPI)


def test_cuda_aware_mpi_is_no_for_an_open_mpi_built_without_cuda(monkeypatch):
    from mpi4py import MPI

    monkeypatch.delenv("ZEN_HVD_CUDA_AWARE_MPI", raising=False)
    if not shutil.which("ompi_info"):
        pytest.skip("not Open MPI")
    info = subprocess.run(["ompi_info", "--parsable", "--all"], capture_output=True, text=True).stdout
    if "mpi_built_with_cuda_support:value:false" not in info.replace("opal_built", "mpi_built"):
        pytest.skip("this Open MPI is built with CUDA")
    assert mpi4py_transport.cuda_aware(MPI) is False


def _message(body: bytes, tail_words) -> np.ndarray:
    """[body][pad to 8][int64 words, the last giving the body's length]."""
    pad = bytes(-len(body) % 8)
    return np.frombuffer(body + pad + np.array(tail_words, np.int64).tobytes(), np.uint8).copy()


def test_joined_is_the_same_on_numpy_and_on_tensors():
    messages = [_message(b"abc", [7, 3]), _message(b"", [0]), np.arange(5, dtype=np.uint8),
                _message(b"0123456789", [10]), _message(b"xy", [99])]   # short; body too long
    got = joined(messages, lambda tag: tag)
    assert bytes(got[0]) == b"abc0123456789"
    assert [bytes(t) for t in got[1]] == [
        np.array([7, 3], np.int64).tobytes(), np.array([0], np.int64).tobytes(), bytes(range(5)),
        np.array([10], np.int64).tobytes(), bytes(messages[4])]
    as_tensors = joined([torch.from_numpy(m) for m in messages], lambda tag: tag)
    assert isinstance(as_tensors[0], torch.Tensor)
    assert bytes(as_tensors[0].numpy()) == bytes(got[0])
    assert [bytes(t.numpy()) for t in as_tensors[1]] == [bytes(t) for t in got[1]]
