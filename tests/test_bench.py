"""The benchmarks on a tiny setting: they launch themselves, and their own checks pass."""
import os
import subprocess
import sys

from conftest import HERE, NO_HOROVOD


def test_vs_ddp_launches_itself_and_its_three_syncs_agree():
    # Started plainly: it runs itself under torchrun, here without Horovod.
    proc = subprocess.run([sys.executable, "-m", "zen_hvd.bench.vs_ddp", "--ranks", "2", "--repeats", "2",
                           "--warmup", "1", "--vocab", "20000", "--tokens", "512"],
                          env=dict(os.environ, **NO_HOROVOD), cwd=os.path.join(HERE, ".."),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "reproduce: python -m zen_hvd.bench.vs_ddp --ranks 2" in proc.stdout
    for method in ("ddp-sparse", "ddp-dense", "ddp-zen"):
        row = next(line for line in proc.stdout.splitlines() if line.strip().startswith(method))
        assert " True" in row, row
