"""The examples (examples/): on 2 ranks, Zen and Horovod's dense allreduce train each model to
the same parameters (tests/mpi/example_cases.py), as do Zen's DDP comm hook and DDP's own
reduction under torchrun without Horovod; and the data readers reject malformed input naming
where it is."""
import importlib.util
import os
import re

import pytest

from conftest import HERE, NO_HOROVOD, mpirun, torchrun

EXAMPLES = os.path.join(HERE, "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zen_and_horovod_dense_train_every_example_alike():
    proc = mpirun(2, "example_cases.py", timeout=240)
    for name in ("lstm_lm", "deepfm", "nmt", "gpt"):
        assert f"{name}: zen and horovod-dense end with the same" in proc.stdout
    assert "gpt: DGC through auto and through agsparse end with the same" in proc.stdout
    assert "example_cases: all passed" in proc.stdout


def test_zen_hook_and_ddp_train_every_example_alike_under_torchrun():
    proc = torchrun(2, "example_cases.py", "--ddp", env=NO_HOROVOD, timeout=240)
    for name in ("lstm_lm", "deepfm", "nmt", "gpt"):
        assert f"{name}: DDP's zen hook and DDP's own reduction end with the same" in proc.stdout
    assert "gpt: DDP's DGC hook through auto and through agsparse end with the same" in proc.stdout
    assert "example_cases: all passed (DDP)" in proc.stdout


def criteo_line(label="1", count="5", value="68fd1e64"):
    return "\t".join([label] + [count] * 13 + [value] * 26) + "\n"


def test_criteo_reader_reads_and_rejects_malformed_lines(tmp_path):
    deepfm = load("deepfm")
    good = tmp_path / "good.txt"
    good.write_text(criteo_line() + criteo_line("0", "", ""))
    rows = list(deepfm.criteo_rows(str(good)))
    assert rows[0] == (1, [5] * 13, [0x68fd1e64] * 26)
    assert rows[1] == (0, [0] * 13, [-1] * 26)
    for bad_line in (criteo_line()[:-1] + "\textra\n", criteo_line(label="x"), criteo_line(count="1.5"),
                     criteo_line(label="3")):
        bad = tmp_path / "bad.txt"
        bad.write_text(criteo_line() + bad_line)
        with pytest.raises(ValueError, match=re.escape(f"{bad}, line 2")):
            list(deepfm.criteo_rows(str(bad)))


def test_parallel_reader_rejects_files_of_different_lengths(tmp_path):
    nmt = load("nmt")
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("a b c\nd e\n")
    tgt.write_text("x y\n")
    with pytest.raises(ValueError, match=re.escape(f"{src} has 2 lines but {tgt} has 1")):
        nmt.read_parallel(str(src), str(tgt), 100, 4)
    tgt.write_text("x y\nz\n")
    source, target = nmt.read_parallel(str(src), str(tgt), 100, 4)
    assert source.shape == target.shape == (2, 4)
    assert list(target[1, 1:]) == [nmt.EOS, nmt.PAD, nmt.PAD]
