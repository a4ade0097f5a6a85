"""The torch transport's choice of addresses for a job across hosts (mpi/torch_transport.py):
rank 0's rendezvous address without a default route, and gloo's interface where the host's
name resolves to loopback (peers on other hosts could not connect to that)."""
import socket

import pytest

from zen_hvd.mpi import torch_transport as tt


def test_interfaces_include_loopback_and_the_first_other_is_chosen():
    found = tt._interfaces()
    assert ("lo", "127.0.0.1") in found
    others = [addr for name, addr in found if name != "lo"]
    assert tt._interface_address() == (others[0] if others else None)


def test_gloo_is_pinned_to_the_interface_towards_rank_0_when_the_name_is_loopback(monkeypatch):
    others = [(name, addr) for name, addr in tt._interfaces() if name != "lo"]
    if not others:
        pytest.skip("no interface besides loopback")
    name, addr = others[0]
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")   # unset to the code; restored after the test
    monkeypatch.setattr(socket, "gethostbyname", lambda host: "127.0.1.1")
    tt._pin_gloo_interface(addr)      # rank 0 on this interface's own address
    assert tt.os.environ.get("GLOO_SOCKET_IFNAME") == name
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "chosen-by-user")
    tt._pin_gloo_interface(addr)      # a user's choice stays
    assert tt.os.environ["GLOO_SOCKET_IFNAME"] == "chosen-by-user"


def test_gloo_is_left_alone_for_a_local_job(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")   # unset to the code; restored after the test
    monkeypatch.setattr(socket, "gethostbyname", lambda host: "127.0.1.1")
    tt._pin_gloo_interface("127.0.0.1")
    assert tt.os.environ["GLOO_SOCKET_IFNAME"] == ""
